package rootfs

import (
	"errors"
	"fmt"
)

var (
	// ErrFormat: the source is not an image this package reads.
	ErrFormat = errors.New("not an OCI image layout or docker save archive")
	// ErrNotEmpty: the destination already holds files.
	ErrNotEmpty = errors.New("destination is not empty")
)

// LayerError is a layer that could not be applied.
type LayerError struct {
	Layer string // the layer's path in the image
	Err   error
}

func (e *LayerError) Error() string { return fmt.Sprintf("layer %s: %v", e.Layer, e.Err) }

func (e *LayerError) Unwrap() error { return e.Err }
