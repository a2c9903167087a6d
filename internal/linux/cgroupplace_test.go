package linux

import (
	"errors"
	"testing"
)

func TestProcCgroups(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want map[string]string
		err  bool
	}{
		{name: "hybrid", in: "9:name=systemd:/\n4:memory:/kubepods/burstable/pod1/c1\n1:cpu,cpuacct:/a\n0::/\n",
			want: map[string]string{"name=systemd": "/", "memory": "/kubepods/burstable/pod1/c1", "cpu,cpuacct": "/a", "": "/"}},
		{name: "v2", in: "0::/kubepods.slice/kubepods-besteffort.slice/x.scope\n",
			want: map[string]string{"": "/kubepods.slice/kubepods-besteffort.slice/x.scope"}},
		{name: "path with colons", in: "0::/a:b\n", want: map[string]string{"": "/a:b"}},
		{name: "empty", in: "", err: true},
		{name: "no path", in: "0::\n", err: true},
		{name: "relative", in: "0::a/b\n", err: true},
		{name: "one field", in: "garbage\n", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ProcCgroups([]byte(tc.in))
			if tc.err {
				if !errors.Is(err, ErrCgroupPath) {
					t.Fatalf("got %v, %v; want ErrCgroupPath", got, err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%q: got %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestCheckCgroupPath(t *testing.T) {
	for _, p := range []string{"/", "/a", "/a/b.slice/c"} {
		if err := CheckCgroupPath(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	for _, p := range []string{"", "a", "/a/", "/a/../b", "/a//b", "/./a", "/a\x00"} {
		if err := CheckCgroupPath(p); !errors.Is(err, ErrCgroupPath) {
			t.Errorf("%q: %v, want ErrCgroupPath", p, err)
		}
	}
}
