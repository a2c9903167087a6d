package volume

import (
	"strconv"
	"strings"
)

// compareVersions compares dotted versions component by component as
// numbers, a missing component counting as 0: "418" < "418.87.01" < "419".
// Components that are not numbers compare as text.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		x, y := "0", "0"
		if i < len(as) {
			x = as[i]
		}
		if i < len(bs) {
			y = bs[i]
		}
		xi, errx := strconv.ParseUint(x, 10, 64)
		yi, erry := strconv.ParseUint(y, 10, 64)
		switch {
		case errx != nil || erry != nil:
			if c := strings.Compare(x, y); c != 0 {
				return c
			}
		case xi < yi:
			return -1
		case xi > yi:
			return 1
		}
	}
	return 0
}
