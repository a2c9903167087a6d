package record_test

import (
	"errors"
	"fmt"
	"os"

	"github.com/gpuiso/gpuiso/node"
	"github.com/gpuiso/gpuiso/record"
)

// A two-phase record: started before anything is taken, completed once the
// caller has what it asked for. After a restart, a started entry names what
// to undo.
func Example() {
	dir, err := os.MkdirTemp("", "records")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	type held struct {
		GPUs []string `json:"gpus"`
	}
	s, err := record.New(dir, record.Options[held]{Format: "example-container", Version: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	s.Write(record.Entry[held]{Key: "job-1", Phase: record.Started})
	// ... allocate the GPUs ...
	s.Write(record.Entry[held]{Key: "job-1", Phase: record.Completed,
		Process: &node.Process{Pid: 4242, Start: 987654}, Data: held{GPUs: []string{"GPU-0"}}})

	e, err := s.Read("job-1")
	fmt.Println(e.Phase, e.Process, e.Data.GPUs, err)
	_, err = s.Read("job-2")
	fmt.Println(errors.Is(err, record.ErrNoRecord), errors.Is(err, node.ErrNotFound))
	// Output:
	// completed 4242.987654 [GPU-0] <nil>
	// true true
}
