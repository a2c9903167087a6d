package linux

import (
	"slices"
	"strings"
	"testing"
)

func TestParseMountPoints(t *testing.T) {
	const info = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw
40 22 0:40 / /run/gpuiso/native/a/root rw - ext4 /dev/vda rw
41 40 0:5 / /run/gpuiso/native/a/root/dev rw - devtmpfs udev rw
42 40 0:41 / /run/gpuiso/native/a/root/with\040space rw - tmpfs tmpfs rw
43 22 0:42 / /run/gpuiso/native/ab rw - tmpfs tmpfs rw
`
	got, err := ParseMountPoints(strings.NewReader(info), "/run/gpuiso/native/a/root")
	want := []string{"/run/gpuiso/native/a/root", "/run/gpuiso/native/a/root/dev", "/run/gpuiso/native/a/root/with space"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("mount points = %q, %v; want %q", got, err, want)
	}
	if all, _ := ParseMountPoints(strings.NewReader(info), "/"); len(all) != 6 {
		t.Fatalf("all mount points = %q", all)
	}
	for _, bad := range []string{"1 2 3\n", `1 2 3 / /a\09x rw`} {
		if _, err := ParseMountPoints(strings.NewReader(bad), "/"); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
