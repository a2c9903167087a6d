package dra_test

import (
	"os"
	"testing"

	"github.com/gpuiso/gpuiso/internal/testing/testenv"
)

// TestMain fails a run that leaves a descriptor open, a goroutine running
// or a child process behind.
func TestMain(m *testing.M) { os.Exit(testenv.CheckLeaks(m)) }
