package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/node/simnode"
)

// progName prefixes every line gpuiso-runtime writes on stderr.
const progName = "gpuiso-runtime"

// remedyError is an error with what its reader should do about it.
type remedyError struct {
	err error
	do  string
}

func (e *remedyError) Error() string { return e.err.Error() }
func (e *remedyError) Unwrap() error { return e.err }

// withRemedy gives err what to do about it, said after it on the
// refusal's line (the kind it matches stays err's).
func withRemedy(err error, do string) error {
	if err == nil {
		return nil
	}
	return &remedyError{err: err, do: do}
}

// saysWhatToDo marks an error whose own text ends with what to do (the
// node's: a missing driver names --simulate, a refused simulated tree says
// why): nothing is added to it but "run as root" where root is missing,
// and the way out of an unknown topology.
func saysWhatToDo(err error) error { return withRemedy(err, "") }

// remedies say what to do about an error of each kind, the first that
// matches: the runtime's own kinds, then the library's.
var remedies = []struct {
	kind error
	do   string
}{
	{ErrUsage, "put gpuiso-runtime's flags before the command, as its README lists them"},
	{ErrInvalidDevices, "name GPUs by index, GPU- or MIG- UUID, or all, none or void"},
	{ErrInvalidShare, "ask for a share with GPUISO_GPU_MEMORY (a size with its unit, 4GiB) and GPUISO_GPU_COMPUTE (1 to 100), of one GPU at most"},
	{ErrShareNeedsState, "give gpuiso-runtime --state-dir DIR, or ask for whole GPUs"},
	{ErrDeviceHeld, "leave that GPU's node out of the device list, or delete the container that owns it first"},
	{ErrContainerBusy, "wait for the other create, run or delete of that container to end, then try again"},
	{ErrContainerExists, "delete that container first, or use another id"},
	{ErrCorruptRecord, "delete the container (its record is settled and removed), then create it again"},
	{context.DeadlineExceeded, "try again once the holder is done, or raise --timeout"},
	{fs.ErrPermission, needsRoot},
	{allocator.ErrUnknownDevice, "name a GPU the node has (gpuinfo lists them)"},
	{node.ErrInsufficient, "wait for a container to give back its GPUs, or ask for fewer or another GPU"},
	{node.ErrExists, "delete the container that holds it first, or ask for another"},
	{node.ErrUnavailable, "try again once the holder is done"},
	{node.ErrNotFound, "name what the node has (gpuinfo lists its GPUs and driver)"},
	{node.ErrNotSupported, "run it on a node that has what it needs, or ask for less"},
	{node.ErrCorrupt, "move the corrupt file aside, then try again"},
	{node.ErrInvalid, "correct the request and create the container again"},
}

// needsRoot is what to do about a permission gpuiso-runtime lacks.
const needsRoot = "run gpuiso-runtime as root, as the engine's runtime"

// defaultRemedy says what to do about an error of no known kind.
const defaultRemedy = "see the --log file for what came before, correct it and try again"

// refusal is the line gpuiso-runtime writes on stderr for err: its name,
// then remedied's text.
func refusal(err error) string { return progName + ": " + remedied(err) }

// remedied is err's text and what to do about it, as the --log file's
// error record holds it (Docker and containerd show that record as the
// runtime's error).
func remedied(err error) string {
	do := defaultRemedy
	var r *remedyError
	switch {
	case errors.As(err, &r) && r.do == "" && errors.Is(err, fs.ErrPermission):
		do = needsRoot
	case errors.As(err, &r) && r.do == "" && errors.Is(err, simnode.ErrUnknownTopology):
		do = "give --simulate one of the shipped topologies"
	case errors.As(err, &r) && r.do == "":
		return err.Error()
	case errors.As(err, &r):
		do = r.do
	default:
		for _, m := range remedies {
			if errors.Is(err, m.kind) {
				do = m.do
				break
			}
		}
	}
	return fmt.Sprintf("%v: %s", err, do)
}
