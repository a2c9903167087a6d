package main

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/gpuiso/gpuiso/node/simnode"
)

// TestRemedied: a refusal's line is the program's name, the error and what
// to do about it: the error's own remedy, else its kind's; an error that
// says what to do itself (the node's) gets nothing more, except where root
// or a shipped topology is missing.
func TestRemedied(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{name: "kind", err: fmt.Errorf("container c1: NVIDIA_VISIBLE_DEVICES: %w", ErrInvalidDevices),
			want: "gpuiso-runtime: container c1: NVIDIA_VISIBLE_DEVICES: invalid device list: name GPUs by index, GPU- or MIG- UUID, or all, none or void"},
		{name: "own remedy first", err: fmt.Errorf("c1: %w", withRemedy(fmt.Errorf("x: %w", ErrInvalidShare), "do this")),
			want: "gpuiso-runtime: c1: x: invalid GPU share request: do this"},
		{name: "no kind", err: errors.New("something odd"), want: "gpuiso-runtime: something odd: " + defaultRemedy},
		{name: "says what to do", err: saysWhatToDo(errors.New("no driver; run with --simulate NAME")),
			want: "gpuiso-runtime: no driver; run with --simulate NAME"},
		{name: "says what to do, needs root", err: saysWhatToDo(fmt.Errorf("mkdir /x: %w", fs.ErrPermission)),
			want: "gpuiso-runtime: mkdir /x: permission denied: " + needsRoot},
		{name: "unknown topology", err: saysWhatToDo(fmt.Errorf("c1: %w", simnode.ErrUnknownTopology)),
			want: "gpuiso-runtime: c1: unknown topology: give --simulate one of the shipped topologies"},
		{name: "permission", err: fmt.Errorf("open: %w", fs.ErrPermission), want: "gpuiso-runtime: open: permission denied: " + needsRoot},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusal(tc.err); got != tc.want {
				t.Errorf("refusal:\n got %q\nwant %q", got, tc.want)
			}
			if got := remedied(tc.err); "gpuiso-runtime: "+got != tc.want || strings.Contains(got, "\n") {
				t.Errorf("remedied: %q", got)
			}
		})
	}
}
