// Command probe runs inside test containers and reports what it can see and
// do there, one line per question, so tests can compare the output with what
// isolation should allow. It is built statically (CGO_ENABLED=0) so that it
// runs in images built FROM scratch.
//
//	probe open PATH...    "<path> ok|ENXIO|ENODEV|EPERM|ENOENT|<error>" for each read-write open
//	probe write PATH...   "<path> ok|EROFS|<error>" for each file creation
//	probe ls DIR          the names in DIR, one a line
//	probe mknod PATH MAJOR MINOR   "<path> ok|EPERM|<error>" for a character node
//	probe mknod PATH MAJOR MINOR open   the same, then a line for a read-write open of it
//	probe env NAME...     "<name>=<value>" for each variable that is set
//	probe status          its own /proc/self/status (uid, gid, capabilities)
//	probe cat PATH...     "cat <path> <contents as a Go string literal>" for each file (or the error)
//	probe cwd             "cwd <dir>": its working directory
//	probe exit CODE       exits with CODE
//	probe sleep SECONDS   sleeps (fractions allowed), then exits 0 (a container that keeps running)
//	probe wait PATH       waits until PATH exists, then exits 0 (a container held until let go)
//	probe do CMD ARGS... [-- CMD ARGS...]...   several of the above in turn
//	probe escape KEY=VALUE...   tries the ways out of a container (see escape.go)
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: probe open|write|ls|mknod|env|exit|sleep|wait|do ARGS...")
		os.Exit(2)
	}
	if os.Args[1] != "do" {
		run(os.Args[1], os.Args[2:])
		return
	}
	var step []string
	for _, a := range append(os.Args[2:], "--") {
		if a != "--" {
			step = append(step, a)
			continue
		}
		if len(step) > 0 {
			run(step[0], step[1:])
		}
		step = nil
	}
}

// run answers one question.
func run(cmd string, args []string) {
	switch cmd {
	case "open":
		for _, p := range args {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err == nil {
				f.Close()
			}
			fmt.Println(p, result(err))
		}
	case "write":
		for _, p := range args {
			err := os.WriteFile(p, []byte("probe\n"), 0o644)
			fmt.Println(p, result(err))
		}
	case "fill": // fill PATH BYTES: writes BYTES bytes to a new file
		if len(args) != 2 {
			fmt.Println("fill: want PATH BYTES")
			return
		}
		n, _ := strconv.Atoi(args[1])
		err := os.WriteFile(args[0], make([]byte, n), 0o644)
		fmt.Println("fill", args[0], args[1], result(err))
	case "ls":
		for _, dir := range args {
			entries, err := os.ReadDir(dir)
			if err != nil {
				fmt.Println(dir, result(err))
				continue
			}
			for _, e := range entries {
				fmt.Println(e.Name())
			}
		}
	case "mknod":
		if len(args) != 3 && (len(args) != 4 || args[3] != "open") {
			fmt.Fprintln(os.Stderr, "usage: probe mknod PATH MAJOR MINOR [open]")
			os.Exit(2)
		}
		major, _ := strconv.Atoi(args[1])
		minor, _ := strconv.Atoi(args[2])
		dev := minor&0xff | (major&0xfff)<<8 | (minor&^0xff)<<12 // Linux's encoding
		err := syscall.Mknod(args[0], syscall.S_IFCHR|0o666, dev)
		fmt.Println(args[0], result(err))
		if len(args) == 4 {
			f, err := os.OpenFile(args[0], os.O_RDWR, 0)
			if err == nil {
				f.Close()
			}
			fmt.Println(args[0], result(err))
		}
	case "env":
		for _, name := range args {
			if v, ok := os.LookupEnv(name); ok {
				fmt.Printf("%s=%s\n", name, v)
			}
		}
	case "cat":
		for _, p := range args {
			b, err := os.ReadFile(p)
			if err != nil {
				fmt.Println("cat", p, result(err))
				continue
			}
			fmt.Println("cat", p, strconv.Quote(string(b)))
		}
	case "status": // the process's own /proc/self/status
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			fmt.Println("status", result(err))
		}
		os.Stdout.Write(b)
	case "cwd":
		wd, err := os.Getwd()
		if err != nil {
			fmt.Println("cwd", result(err))
			return
		}
		fmt.Println("cwd", wd)
	case "exit":
		code := 0
		if len(args) > 0 {
			code, _ = strconv.Atoi(args[0])
		}
		os.Exit(code)
	case "escape":
		escape(args)
	case "sleep":
		secs := 0.0
		if len(args) > 0 {
			secs, _ = strconv.ParseFloat(args[0], 64)
		}
		time.Sleep(time.Duration(secs * float64(time.Second)))
	case "wait":
		if len(args) != 1 {
			fmt.Fprintln(os.Stderr, "usage: probe wait PATH")
			os.Exit(2)
		}
		for {
			if _, err := os.Stat(args[0]); err == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	default:
		fmt.Fprintf(os.Stderr, "probe: unknown command %q\n", cmd)
		os.Exit(2)
	}
}

func result(err error) string {
	var errno syscall.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &errno):
		for _, e := range []struct {
			errno syscall.Errno
			name  string
		}{{syscall.ENXIO, "ENXIO"}, {syscall.ENODEV, "ENODEV"}, {syscall.EPERM, "EPERM"}, {syscall.EACCES, "EACCES"}, {syscall.ENOENT, "ENOENT"}, {syscall.EROFS, "EROFS"},
			{syscall.ESRCH, "ESRCH"}, {syscall.EBUSY, "EBUSY"}, {syscall.EINVAL, "EINVAL"}, {syscall.ENOSYS, "ENOSYS"}, {syscall.EBADF, "EBADF"}, {syscall.ENOSPC, "ENOSPC"}} {
			if errno == e.errno {
				return e.name
			}
		}
	}
	return err.Error()
}
