package isolator

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxOwnerLen is the longest owner id, in bytes.
const MaxOwnerLen = 128

// ValidateOwner checks that an owner (container) id can name kernel objects:
// a cgroup directory, a mount point. It rejects empty ids, ".", "..", ids
// with "/", control characters or invalid UTF-8, and ids over MaxOwnerLen
// bytes.
func ValidateOwner(owner string) error {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrInvalidOwner, owner, why) }
	switch {
	case owner == "":
		return bad("empty")
	case len(owner) > MaxOwnerLen:
		return bad(fmt.Sprintf("%d bytes, the limit is %d", len(owner), MaxOwnerLen))
	case owner == "." || owner == "..":
		return bad("a relative path element")
	case !utf8.ValidString(owner):
		return bad("not UTF-8")
	}
	for _, r := range owner {
		if r == '/' || r == 0 || unicode.IsControl(r) {
			return bad(fmt.Sprintf("contains %q", r))
		}
	}
	return nil
}
