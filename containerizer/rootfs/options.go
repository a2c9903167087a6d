package rootfs

import (
	"fmt"
	"os"
)

// The default limits: what an [Unpack] given no [WithLimits] allows.
const (
	// DefaultBytes: 32 GiB of file content.
	DefaultBytes = 32 << 30
	// DefaultEntries: a million archive entries.
	DefaultEntries = 1 << 20
	// DefaultRatio: a compressed layer may expand to 100 times its size.
	DefaultRatio = 100
	// RatioFloor is how much a compressed layer may expand to before its
	// ratio is checked: small layers of tar headers and padding compress
	// far better than file content does.
	RatioFloor = 16 << 20
)

// Limits bound what one [Unpack] does. A zero field takes its default.
type Limits struct {
	// Bytes is the most file content written, counted at each regular
	// file's full length (holes included, though they take no disk), so
	// that it bounds time as well as space. The destination and the
	// scratch directory each have this budget.
	Bytes int64
	// Entries is the most tar entries read (files, directories, links,
	// whiteouts), over all layers; the image tar's own entries have a
	// budget of their own.
	Entries int64
	// Ratio is the most a compressed layer may expand: bytes decompressed
	// over compressed bytes read, checked past [RatioFloor] bytes.
	Ratio int64
}

func (l Limits) withDefaults() Limits {
	if l.Bytes == 0 {
		l.Bytes = DefaultBytes
	}
	if l.Entries == 0 {
		l.Entries = DefaultEntries
	}
	if l.Ratio == 0 {
		l.Ratio = DefaultRatio
	}
	return l
}

// Option changes how [Unpack] works.
type Option func(*options) error

type options struct {
	limits  Limits
	scratch string
}

// WithLimits sets the limits; a zero field keeps its default. A negative
// one is an error matching [ErrInvalidOption].
func WithLimits(l Limits) Option {
	return func(c *options) error {
		if l.Bytes < 0 || l.Entries < 0 || l.Ratio < 0 {
			return fmt.Errorf("%w: negative limit in %+v", ErrInvalidOption, l)
		}
		c.limits = l
		return nil
	}
}

// WithScratchDir makes [Unpack] lay out an image tar in a directory under
// dir (named "gpuiso-unpack-*") instead of under [os.TempDir]. dir must
// exist.
func WithScratchDir(dir string) Option {
	return func(c *options) error {
		if dir == "" {
			return fmt.Errorf("%w: empty scratch directory", ErrInvalidOption)
		}
		c.scratch = dir
		return nil
	}
}

func newOptions(opts []Option) (options, error) {
	c := options{scratch: os.TempDir()}
	for _, o := range opts {
		if o == nil {
			return options{}, fmt.Errorf("nil option: %w", ErrInvalidOption)
		}
		if err := o(&c); err != nil {
			return options{}, err
		}
	}
	c.limits = c.limits.withDefaults()
	return c, nil
}
