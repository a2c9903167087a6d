package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Exit statuses of the example programs, as `docker run` has them.
const (
	ExitOK    = 0
	ExitError = 125 // the program's own error: bad flags, a refused request
)

// Subcommand reads the subcommand of a program with several (nvvolume build,
// nvcdi generate): "-h"/"--help" prints usage to stdout and ends with
// ExitOK; no command, a flag before it or an unknown one is a one-line error
// on stderr ending with ExitError. done reports that the program ends with
// code.
func Subcommand(prog string, cmds, args []string, usage string, stdout, stderr io.Writer) (cmd string, code int, done bool) {
	list := strings.Join(cmds[:len(cmds)-1], ", ") + " or " + cmds[len(cmds)-1]
	switch {
	case len(args) == 0:
		fmt.Fprintf(stderr, "%s: no command (%s; see %s --help)\n", prog, list, prog)
		return "", ExitError, true
	case args[0] == "-h" || args[0] == "-help" || args[0] == "--help":
		fmt.Fprint(stdout, usage)
		return "", ExitOK, true
	case strings.HasPrefix(args[0], "-"):
		fmt.Fprintf(stderr, "%s: %s before the command (%s; see %s --help)\n", prog, args[0], list, prog)
		return "", ExitError, true
	case !slices.Contains(cmds, args[0]):
		fmt.Fprintf(stderr, "%s: unknown command %q (%s)\n", prog, args[0], list)
		return "", ExitError, true
	}
	return args[0], 0, false
}

// Parse parses args with fs, whose output it silences: "-h"/"--help" prints
// usage and the flags to stdout and ends with ExitOK; a bad flag is one line
// on stderr ending with ExitError. done reports that the program ends with
// code.
func Parse(fs *flag.FlagSet, args []string, usage string, stdout, stderr io.Writer) (code int, done bool) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return ExitOK, true
	case err != nil:
		prog, _, _ := strings.Cut(fs.Name(), " ")
		fmt.Fprintf(stderr, "%s: %v (see %s --help)\n", fs.Name(), err, prog)
		return ExitError, true
	}
	return 0, false
}
