package containerizer

import (
	"fmt"
	"strconv"
	"strings"
)

// User is the numeric user and group a container's command runs as.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// MaxID is the largest user or group id a container may run as: 2^32-2.
const MaxID = 1<<32 - 2

// ParseUser reads "UID" or "UID:GID" (numbers; the group defaults to the
// user's number). Each number is at most MaxID: 4294967295 is (uid_t)-1,
// which the kernel's setuid and chown take as "no change". Anything else is
// an error matching ErrInvalidSpec.
func ParseUser(s string) (User, error) {
	uid, gid, hasGID := strings.Cut(s, ":")
	if !hasGID {
		gid = uid
	}
	u, err1 := strconv.ParseUint(uid, 10, 32)
	g, err2 := strconv.ParseUint(gid, 10, 32)
	if err1 != nil || err2 != nil {
		return User{}, fmt.Errorf("%w: user %q: want UID or UID:GID, numeric", ErrInvalidSpec, s)
	}
	if u > MaxID || g > MaxID {
		return User{}, fmt.Errorf("%w: user %q: ids go up to %d", ErrInvalidSpec, s, MaxID)
	}
	return User{UID: uint32(u), GID: uint32(g)}, nil
}

// String writes u as "UID:GID".
func (u User) String() string { return fmt.Sprintf("%d:%d", u.UID, u.GID) }
