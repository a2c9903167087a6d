package linux

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// opens watches dir for opens of the files in it (inotify IN_OPEN) and
// returns a function that lists the names opened since.
func opens(t *testing.T, dir string) func() []string {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	return func() []string {
		var names []string
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if n <= 0 || err != nil {
				return names
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				if s := strings.TrimRight(string(name), "\x00"); s != "" {
					names = append(names, s)
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// TestOpenFileInRoot: files are found as inside the root (absolute links and
// ".." kept there, a link to a host folder leads to the root's own path),
// only regular files are opened, and a FIFO, a device or a link in the last
// component is refused with ErrNotRegular without being opened.
func TestOpenFileInRoot(t *testing.T) {
	root := t.TempDir()
	host := t.TempDir() // a host folder an image's link names
	write := func(dir, name, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	write(root, "usr/local/cuda-12/compat/lib.so", "image's")
	write(host, "lib.so", "host's")
	write(root, "etc/passwd", "root:x:0:0::/root:/bin/sh\n")
	link("/usr/local/cuda-12", "usr/local/cuda")
	link(host, "usr/local/hostlink")
	link("../../../../../../..", "usr/local/up")
	link("lib.so", "usr/local/cuda-12/compat/lib.so.1")
	special := filepath.Join(root, "usr/local/cuda-12/compat")
	if err := unix.Mkfifo(filepath.Join(special, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	dev := IsRoot()
	if dev {
		if err := unix.Mknod(filepath.Join(special, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
	}
	opened := opens(t, special)
	// O_PATH handles raise no IN_OPEN on current kernels; where they do,
	// the events cannot tell a check from an open.
	if h, err := os.OpenFile(filepath.Join(special, "lib.so"), unix.O_PATH, 0); err == nil {
		h.Close()
	}
	watched := len(opened()) == 0

	for _, tc := range []struct {
		name, path, want string
		err              error
	}{
		{name: "plain", path: "etc/passwd", want: "root:x:0:0::/root:/bin/sh\n"},
		{name: "absolute link inside", path: "/usr/local/cuda/compat/lib.so", want: "image's"},
		{name: "dot-dot kept inside", path: "usr/local/up/etc/passwd", want: "root:x:0:0::/root:/bin/sh\n"},
		{name: "name climbing out", path: "../../../etc/passwd", want: "root:x:0:0::/root:/bin/sh\n"},
		{name: "link to a host folder", path: "usr/local/hostlink/lib.so", err: fs.ErrNotExist},
		{name: "link in the last component", path: "usr/local/cuda/compat/lib.so.1", err: ErrNotRegular},
		{name: "fifo", path: "usr/local/cuda/compat/fifo", err: ErrNotRegular},
		{name: "directory", path: "usr/local/cuda/compat", err: ErrNotRegular},
		{name: "root", path: "/", err: ErrNotRegular},
		{name: "device", path: "usr/local/cuda/compat/null", err: ErrNotRegular},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "device" && !dev {
				t.Skip("mknod needs root")
			}
			f, err := OpenFileInRoot(root, tc.path)
			if tc.err != nil {
				if f != nil {
					f.Close()
				}
				if !errors.Is(err, tc.err) {
					t.Fatalf("OpenFileInRoot(%s) = %v, want %v", tc.path, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b, err := io.ReadAll(f)
			if err != nil || string(b) != tc.want {
				t.Fatalf("read %q, %v; want %q", b, err, tc.want)
			}
		})
	}
	if !watched {
		t.Log("this kernel reports O_PATH handles as opens: no check that special files stay unopened")
		return
	}
	for _, name := range opened() {
		if name == "fifo" || name == "null" {
			t.Errorf("%s was opened", name)
		}
	}
}

// TestReadDirInRoot: a directory is found through links inside the root,
// never on the host, and entries are bounded.
func TestReadDirInRoot(t *testing.T) {
	root, host := t.TempDir(), t.TempDir()
	for _, d := range []string{root + "/opt/real", host} {
		for _, n := range []string{"a", "b", "c"} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, n), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Symlink("/opt/real", root+"/opt/abs"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, root+"/opt/host"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(root+"/opt/fifo", 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := ReadDirInRoot(root, "/opt/abs", 0); err != nil || len(e) != 3 {
		t.Errorf("through an absolute link: %d entries, %v; want 3", len(e), err)
	}
	if e, err := ReadDirInRoot(root, "opt/abs", 2); err != nil || len(e) != 2 {
		t.Errorf("at most 2: %d entries, %v", len(e), err)
	}
	if e, err := ReadDirInRoot(root, "opt/host", 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a link to a host folder: %d entries, %v; want not found", len(e), err)
	}
	if _, err := ReadDirInRoot(root, "opt/fifo", 0); !errors.Is(err, ErrNotDirectory) {
		t.Errorf("a FIFO: %v, want ErrNotDirectory", err)
	}
}
