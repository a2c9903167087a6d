package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"strings"

	"github.com/gpuiso/gpuiso/allocator"
	"github.com/gpuiso/gpuiso/node"
)

// containerState is what runc says of a container.
type containerState struct {
	Pid    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
}

// errNoContainer: runc knows no such container.
var errNoContainer = node.Sentinel(node.ErrNotFound, "container does not exist")

// runcState asks runc (the binary runc, in root) for container id's state.
func runcState(ctx context.Context, runc, root, id string) (containerState, error) {
	ctx, cancel := context.WithTimeout(ctx, stateTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, runc, "--root", root, "state", id)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && strings.Contains(stderr.String(), "does not exist") {
		return containerState{}, fmt.Errorf("runc state %s in %s: %w", id, root, errNoContainer)
	}
	if err != nil {
		return containerState{}, fmt.Errorf("runc state %s in %s: %w: %s", id, root, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var st containerState
	if err := json.Unmarshal(out, &st); err != nil {
		return containerState{}, fmt.Errorf("runc state %s in %s: %w", id, root, err)
	}
	return st, nil
}

// liveInit returns the holder of r's container's init when runc reports
// the container with a live init; nil, nil when the container does not
// exist or its init is dead. With bundle set, a container created from
// another bundle counts as not existing (another's container of that id).
func (r ctrRecord) liveInit(ctx context.Context, bundle string) (*allocator.Holder, error) {
	st, err := runcState(ctx, r.Runc, r.Root, r.ID)
	if errors.Is(err, errNoContainer) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if st.Status == "stopped" || st.Pid <= 0 || (bundle != "" && resolvePath(st.Bundle) != bundle) {
		return nil, nil
	}
	h, err := allocator.ProcessHolder("", st.Pid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &h, nil
}
