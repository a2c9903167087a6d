package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"

	"github.com/gpuiso/gpuiso/internal/linux"
)

// ManifestName is the file in a volume's directory that describes it.
const ManifestName = ".manifest.json"

// manifestSchema is the manifest layout version.
const manifestSchema = 1

// Manifest describes a built volume, so that a later call can verify it.
type Manifest struct {
	Schema       int            `json:"schema"`
	Version      string         `json:"version"`
	Capabilities []Capability   `json:"capabilities"`
	Files        []ManifestFile `json:"files"`
	Links        []Link         `json:"links"`
	// Checksum is the SHA-256 of the manifest with Checksum empty.
	Checksum string `json:"checksum"`
}

// ManifestFile is one file of a volume as built.
type ManifestFile struct {
	File
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	ModTime int64       `json:"modTime"` // nanoseconds since the epoch
	// Linked is true for a hard link of Source; Dev and Inode then name the
	// file both share, and the content is the host's own.
	Linked bool   `json:"linked,omitempty"`
	Dev    uint64 `json:"dev,omitempty"`
	Inode  uint64 `json:"inode,omitempty"`
	// CRC32C is the Castagnoli CRC-32 of a copied file's content.
	CRC32C uint32 `json:"crc32c,omitempty"`
}

func (mf *Manifest) seal() error {
	mf.Checksum = ""
	b, err := json.Marshal(mf)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	mf.Checksum = hex.EncodeToString(sum[:])
	return nil
}

// readManifest reads and checks the manifest of the volume at dir.
func readManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, err
	}
	var mf Manifest
	if err := json.Unmarshal(b, &mf); err != nil {
		return nil, &DamagedError{Path: dir, Problems: []string{"manifest: " + err.Error()}}
	}
	want := mf.Checksum
	if err := mf.seal(); err != nil || mf.Checksum != want || mf.Schema != manifestSchema {
		return nil, &DamagedError{Path: dir, Problems: []string{"manifest checksum or schema mismatch"}}
	}
	return &mf, nil
}

// verify checks the volume at dir against mf: every file and link as built
// and nothing else. Deep verification reads copied files for their CRC and
// checks that linked files are still the host's.
func (mf *Manifest) verify(dir string, deep bool) error {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	want := map[string]bool{ManifestName: true, BinDir: true, LibDir: true, Lib64Dir: true}
	for _, f := range mf.Files {
		want[f.Path] = true
		p := filepath.Join(dir, filepath.FromSlash(f.Path))
		fi, err := os.Lstat(p)
		if err != nil {
			bad("%s: %v", f.Path, err)
			continue
		}
		if !fi.Mode().IsRegular() || fi.Size() != f.Size || fi.Mode() != f.Mode || fi.ModTime().UnixNano() != f.ModTime {
			bad("%s: %v %d bytes modified %v, want %v %d bytes modified %d", f.Path, fi.Mode(), fi.Size(), fi.ModTime().UnixNano(), f.Mode, f.Size, f.ModTime)
			continue
		}
		if f.Linked {
			if dev, ino, ok := linux.Inode(fi); !ok || dev != f.Dev || ino != f.Inode {
				bad("%s: no longer the linked file", f.Path)
			}
		}
		if !deep {
			continue
		}
		if f.Linked {
			if si, err := os.Stat(f.Source); err != nil || !os.SameFile(si, fi) {
				bad("%s: not the host's %s any more", f.Path, f.Source)
			}
			continue
		}
		if sum, err := crcFile(p); err != nil || sum != f.CRC32C {
			bad("%s: content checksum mismatch (%v)", f.Path, err)
		}
	}
	for _, l := range mf.Links {
		want[l.Path] = true
		if t, err := os.Readlink(filepath.Join(dir, filepath.FromSlash(l.Path))); err != nil || t != l.Target {
			bad("%s: link to %q (%v), want %q", l.Path, t, err, l.Target)
		}
	}
	// Nothing else may have crept in.
	for _, d := range []string{".", BinDir, LibDir, Lib64Dir} {
		entries, err := os.ReadDir(filepath.Join(dir, d))
		if err != nil {
			bad("%s: %v", d, err)
			continue
		}
		for _, e := range entries {
			if p := path.Join(d, e.Name()); !want[p] {
				bad("%s: not in the manifest", p)
			}
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return &DamagedError{Path: dir, Problems: problems}
	}
	return nil
}

func crcFile(p string) (uint32, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	if _, err := io.Copy(h, f); err != nil {
		return 0, err
	}
	return h.Sum32(), nil
}
