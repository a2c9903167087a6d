package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuiso/gpuiso/containerizer"
)

const (
	passwd = `root:x:0:0:root:/root:/bin/bash
daemon:x:1:1::/:/bin/false
app:x:1000:1001::/home/app:/bin/sh
huge:x:4294967295:0::/:/bin/sh
`
	group = `root:x:0:
daemon:x:1:
appgrp:x:1001:app
video:x:44:app
`
)

// imageRoot writes a root file system with the files given.
func imageRoot(t *testing.T, files map[string]string, links map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, body := range files {
		os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for p, target := range links {
		os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755)
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestResolveUser(t *testing.T) {
	host := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(host, []byte("evil:x:0:0::/:/bin/sh\n"), 0o644)
	full := map[string]string{"etc/passwd": passwd, "etc/group": group}
	for _, tc := range []struct {
		name, spec string
		files      map[string]string
		links      map[string]string
		want       containerizer.User
		err        bool
	}{
		{name: "empty is root", spec: "", files: full, want: containerizer.User{}},
		{name: "root by name", spec: "root", files: full, want: containerizer.User{}},
		{name: "name", spec: "app", files: full, want: containerizer.User{UID: 1000, GID: 1001}},
		{name: "listed uid takes its group", spec: "1000", files: full, want: containerizer.User{UID: 1000, GID: 1001}},
		{name: "unlisted uid takes group 0", spec: "5000", files: full, want: containerizer.User{UID: 5000, GID: 0}},
		{name: "uid:gid", spec: "5000:5000", files: full, want: containerizer.User{UID: 5000, GID: 5000}},
		{name: "name:group", spec: "app:video", files: full, want: containerizer.User{UID: 1000, GID: 44}},
		{name: "uid:group", spec: "1000:video", files: full, want: containerizer.User{UID: 1000, GID: 44}},
		{name: "name:gid", spec: "app:7", files: full, want: containerizer.User{UID: 1000, GID: 7}},
		{name: "unknown name", spec: "nobody", files: full, err: true},
		{name: "unknown group", spec: "app:nogroup", files: full, err: true},
		{name: "negative uid", spec: "-1", files: full, err: true},
		{name: "uid -1", spec: "4294967295", files: full, err: true},
		{name: "gid -1", spec: "1000:4294967295", files: full, err: true},
		{name: "listed uid -1", spec: "huge", files: full, err: true},
		{name: "no passwd, empty", spec: "", want: containerizer.User{}},
		{name: "no passwd, uid", spec: "1000", want: containerizer.User{UID: 1000}},
		{name: "no passwd, name", spec: "app", err: true},
		{
			name: "passwd through an absolute symlink", spec: "app",
			files: map[string]string{"usr/share/passwd": passwd, "etc/group": group},
			links: map[string]string{"etc/passwd": "/usr/share/passwd"},
			want:  containerizer.User{UID: 1000, GID: 1001},
		},
		{
			name: "passwd symlinked to a host file", spec: "evil",
			links: map[string]string{"etc/passwd": host}, err: true,
		},
		{
			name: "passwd climbing out", spec: "evil",
			links: map[string]string{"etc/passwd": "../../../../../../../../" + host}, err: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveUser(imageRoot(t, tc.files, tc.links), tc.spec)
			if tc.err {
				if !errors.Is(err, containerizer.ErrInvalidSpec) {
					t.Fatalf("ResolveUser(%q) = %v, %v; want ErrInvalidSpec", tc.spec, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ResolveUser(%q) = %v, %v; want %v", tc.spec, got, err, tc.want)
			}
		})
	}
}

func TestEnsureDir(t *testing.T) {
	outside := t.TempDir()
	for _, tc := range []struct {
		name, dir string
		links     map[string]string
		files     map[string]string
		made      string // where the directory must be, in the root
		err       error
	}{
		{name: "missing", dir: "/work/dir", made: "work/dir"},
		{name: "there", dir: "/etc", files: map[string]string{"etc/x": ""}, made: "etc"},
		{name: "relative", dir: "srv", made: "srv"},
		{name: "root", dir: "/", made: "."},
		{name: "through an absolute symlink", dir: "/w/x", links: map[string]string{"w": "/elsewhere"}, made: "elsewhere/x"},
		{name: "symlink to the host", dir: "/w/x", links: map[string]string{"w": outside}, made: filepath.Join(outside, "x")},
		{name: "climbing", dir: "/../../../../x", made: "x"},
		{name: "a file", dir: "/etc/x", files: map[string]string{"etc/x": ""}, err: containerizer.ErrInvalidSpec},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := imageRoot(t, tc.files, tc.links)
			err := EnsureDir(root, tc.dir)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("EnsureDir(%q) = %v, want %v", tc.dir, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(filepath.Join(root, tc.made)); err != nil || !fi.IsDir() {
				t.Errorf("%s is not a directory in the root: %v", tc.made, err)
			}
			if got := listTree(t, outside); len(got) > 0 {
				t.Errorf("made outside the root: %q", got)
			}
		})
	}
}

// TestResolveUserSpecialFile: an image whose /etc/passwd is a FIFO is
// refused at once, the FIFO never opened (a read of it would block).
func TestResolveUserSpecialFile(t *testing.T) {
	root := imageRoot(t, map[string]string{"etc/group": group}, nil)
	if err := mkfifo(filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ResolveUser(root, "app")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, containerizer.ErrInvalidSpec) || !strings.Contains(err.Error(), "not a regular file") {
			t.Fatalf("ResolveUser = %v, want ErrInvalidSpec: not a regular file", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ResolveUser blocks on a FIFO /etc/passwd")
	}
}
