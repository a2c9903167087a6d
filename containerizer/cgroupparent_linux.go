package containerizer

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"

	"github.com/gpuiso/gpuiso/isolator/cgroups"
)

// CgroupParent is the cgroup parent of the containers whose state lives
// in stateDir, relative to the hierarchy's mount: under
// cgroups.DefaultParent, "<letter><12 hex digits>" of the SHA-256 of the
// directory's absolute path (after salt and a NUL, where salt is not
// empty). Containers of two state directories then never share a parent,
// and a recovery that removes the cgroups no record explains stays within
// its own. The letter and salt tell apart the users of one naming that
// might be given the same directory, and keep the names their containers'
// cgroups already have: the native runtime's are "i" and none
// (native.CgroupParent), the chain isolator's "a" and "chain"
// (chain.CgroupParent).
func CgroupParent(letter, salt, stateDir string) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	in := filepath.Clean(abs)
	if salt != "" {
		in = salt + "\x00" + in
	}
	sum := sha256.Sum256([]byte(in))
	return cgroups.DefaultParent + "/" + letter + hex.EncodeToString(sum[:6])
}
