package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
)

// The convention every example program follows (examples/README.md says it
// to users):
//
//   - "-h" or "--help" prints the usage to stdout: a "usage: PROG ..." line,
//     what the program does, its flags spelt --name; exit status 0. A program
//     with subcommands gives each its own help ("nvvolume build --help"),
//     listing only that subcommand's flags.
//   - Exit statuses are docker run's: 125 for an error of the program itself
//     (a usage error included), 126 when the command cannot be executed,
//     127 when it is not found, 128+n when the program or its command was
//     killed by signal n, the command's own status otherwise.
//   - An error is one line on stderr, "PROG: ...", naming its real cause; a
//     usage error ends with "(see PROG --help)".
//   - A flag that would be ignored, or that contradicts another, is a usage
//     error.
const (
	ExitOK            = 0
	ExitError         = 125 // the program's own error, usage errors included
	ExitCannotExecute = 126 // the command exists but cannot be executed
	ExitNotFound      = 127 // the command was not found
	exitSignalBase    = 128 // 128+n: killed by signal n
)

// ExitSignal is the exit status of a program ended by sig: 128+n.
func ExitSignal(sig syscall.Signal) int { return exitSignalBase + int(sig) }

// Subcommand reads the subcommand of a program with several (nvvolume build,
// nvcdi generate): "-h"/"--help" prints usage to stdout and ends with
// ExitOK; no command, a flag before it or an unknown one is a one-line error
// on stderr ending with ExitError. done reports that the program ends with
// code.
func Subcommand(prog string, cmds, args []string, usage string, stdout, stderr io.Writer) (cmd string, code int, done bool) {
	list := strings.Join(cmds[:len(cmds)-1], ", ") + " or " + cmds[len(cmds)-1]
	switch {
	case len(args) == 0:
		return "", Usagef(stderr, prog, "no command (%s)", list), true
	case args[0] == "-h" || args[0] == "-help" || args[0] == "--help":
		fmt.Fprint(stdout, usage)
		return "", ExitOK, true
	case strings.HasPrefix(args[0], "-"):
		return "", Usagef(stderr, prog, "%s before the command (%s)", args[0], list), true
	case !slices.Contains(cmds, args[0]):
		return "", Usagef(stderr, prog, "unknown command %q (%s)", args[0], list), true
	}
	return args[0], 0, false
}

// Parse parses args with fs, whose output it silences: "-h"/"--help" prints
// usage and fs's flags (PrintFlags) to stdout and ends with ExitOK; a bad
// flag is one line on stderr ending with ExitError. done reports that the
// program ends with code.
func Parse(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) (code int, done bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		PrintFlags(stdout, fs)
		return ExitOK, true
	case err != nil:
		return Usagef(stderr, fs.Name(), "%s", dashes(err.Error())), true
	}
	return 0, false
}

// Usagef writes a usage error of prog (the program, or "program
// subcommand") as one line on stderr, pointing at its help, and returns
// ExitError.
func Usagef(stderr io.Writer, prog, format string, a ...any) int {
	fmt.Fprintf(stderr, "%s: %s (see %s --help)\n", prog, fmt.Sprintf(format, a...), prog)
	return ExitError
}

// Errorf writes an error of prog as one line on stderr and returns
// ExitError.
func Errorf(stderr io.Writer, prog, format string, a ...any) int {
	msg := strings.ReplaceAll(fmt.Sprintf(format, a...), "\n", "; ")
	fmt.Fprintf(stderr, "%s: %s\n", prog, msg)
	return ExitError
}

// dashes rewrites the flag package's messages, which name flags "-name",
// to the "--name" the programs document.
func dashes(msg string) string {
	for _, p := range []string{"flag provided but not defined: -", "flag needs an argument: -", "bad flag syntax: -"} {
		if strings.HasPrefix(msg, p) && !strings.HasPrefix(msg, p+"-") {
			return p + "-" + msg[len(p):]
		}
	}
	if strings.HasPrefix(msg, "invalid value ") || strings.HasPrefix(msg, "invalid boolean value ") {
		return strings.Replace(msg, " for flag -", " for flag --", 1)
	}
	return msg
}

// PrintFlags writes fs's flags as the programs document them: "--name
// VALUE", then the usage and the default.
func PrintFlags(w io.Writer, fs *flag.FlagSet) {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	fs.VisitAll(func(f *flag.Flag) {
		arg, text := flag.UnquoteUsage(f)
		// The flag package's type names, as a usage line has them.
		switch arg {
		case "int", "uint":
			arg = "N"
		case "float":
			arg = "F"
		case "string", "value":
			arg = "VALUE"
		case "duration":
			arg = "DURATION"
		}
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		switch f.DefValue {
		case "", "0", "false", "[]":
		default:
			text += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, strings.ReplaceAll(text, "\n", "\n    \t"))
	})
}

// Set returns the names of the flags of fs that args set.
func Set(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// NotifyContext is signal.NotifyContext for SIGINT and SIGTERM that also
// tells which signal came: signaled returns it (0 before any), so that the
// program can end with ExitSignal. stop releases the signals.
func NotifyContext(parent context.Context) (ctx context.Context, signaled func() syscall.Signal, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	var got atomic.Int32
	go func() {
		select {
		case s := <-ch:
			if sig, ok := s.(syscall.Signal); ok {
				got.Store(int32(sig))
			}
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() syscall.Signal { return syscall.Signal(got.Load()) }, func() {
		signal.Stop(ch)
		cancel()
	}
}

// StartStatus is the exit status for a command that could not be started
// (err from starting it, by exec or by a container runtime, whose errors
// carry the same words): 127 when it was not found, 126 when it cannot be
// executed, and ok false for any other error.
func StartStatus(err error) (code int, ok bool) {
	if err == nil {
		return 0, false
	}
	if errors.Is(err, exec.ErrNotFound) {
		return ExitNotFound, true
	}
	// A runtime's words for a command that exec refused: runc says
	// `exec: "x": executable file not found in $PATH` or
	// `exec: "/x": permission denied` when it starts the container.
	msg := err.Error()
	_, execErr, isExec := strings.Cut(msg, "exec: ")
	switch {
	case strings.Contains(msg, "executable file not found"),
		isExec && strings.Contains(execErr, "no such file or directory"):
		return ExitNotFound, true
	case isExec && (strings.Contains(execErr, "permission denied") || strings.Contains(execErr, "exec format error")):
		return ExitCannotExecute, true
	}
	return 0, false
}
