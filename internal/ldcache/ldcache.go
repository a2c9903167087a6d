package ldcache

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Layout names the layout of a cache file.
type Layout int

const (
	// LayoutNew is the "glibc-ld.so.cache1.1" layout alone.
	LayoutNew Layout = iota
	// LayoutCompat is the old "ld.so-1.7.0" layout followed by the new one.
	LayoutCompat
)

func (l Layout) String() string {
	if l == LayoutCompat {
		return "compat"
	}
	return "new"
}

const (
	magicOld = "ld.so-1.7.0"
	magicNew = "glibc-ld.so.cache"
	version  = "1.1"

	oldHeaderSize = 16 // magic[11], 1 byte of padding, uint32 nlibs
	oldEntrySize  = 12 // int32 flags, uint32 key, uint32 value
	newHeaderSize = 48
	newEntrySize  = 24 // flags, key, value, osversion, hwcap
	newAlign      = 8

	// Byte-order values of the new header's flags byte (glibc 2.33 and later).
	endianLittle = 2
	endianBig    = 3
)

// Entry flags: the low byte is the library's kind, the next byte its
// architecture.
const (
	FlagTypeMask = 0x00ff
	FlagArchMask = 0xff00

	FlagELF      = 0x0001
	FlagELFLibc5 = 0x0002
	FlagELFLibc6 = 0x0003

	FlagSPARCLib64       = 0x0100
	FlagIA64Lib64        = 0x0200
	FlagX8664Lib64       = 0x0300
	FlagS390Lib64        = 0x0400
	FlagPowerPCLib64     = 0x0500
	FlagMIPS64LibN32     = 0x0600
	FlagMIPS64LibN64     = 0x0700
	FlagX8664LibX32      = 0x0800
	FlagARMLibHF         = 0x0900
	FlagAArch64Lib64     = 0x0a00
	FlagARMLibSF         = 0x0b00
	FlagMIPSLib32NaN2008 = 0x0c00
	FlagMIPS64N32NaN2008 = 0x0d00
	FlagMIPS64N64NaN2008 = 0x0e00
	FlagLArchSoft        = 0x1100
	FlagLArchDouble      = 0x1200
)

// Entry is one library of the cache.
type Entry struct {
	// Key is the name the linker looks up, normally the soname.
	Key string
	// Value is the path of the file the linker loads for Key.
	Value string
	// Flags are the kind and architecture of the library (the Flag constants).
	Flags int32
	// OSVersion is the minimum kernel version the library needs, or 0.
	OSVersion uint32
	// HWCap holds the hardware capabilities the library needs, or 0.
	HWCap uint64
}

// Bits returns 64 or 32 for a library of a known 64- or 32-bit architecture
// (by its flags), and 0 when the flags do not tell.
func (e Entry) Bits() int {
	switch e.Flags & FlagArchMask {
	case FlagSPARCLib64, FlagIA64Lib64, FlagX8664Lib64, FlagS390Lib64, FlagPowerPCLib64,
		FlagMIPS64LibN64, FlagAArch64Lib64, FlagMIPS64N64NaN2008, FlagLArchSoft, FlagLArchDouble:
		return 64
	case 0, FlagMIPS64LibN32, FlagX8664LibX32, FlagARMLibHF, FlagARMLibSF,
		FlagMIPSLib32NaN2008, FlagMIPS64N32NaN2008:
		return 32
	}
	return 0
}

// IsELF reports whether the entry is an ELF library (of any libc).
func (e Entry) IsELF() bool {
	switch e.Flags & FlagTypeMask {
	case FlagELF, FlagELFLibc5, FlagELFLibc6:
		return true
	}
	return false
}

// Cache is a parsed cache file.
type Cache struct {
	// Layout is the layout the file was written in.
	Layout Layout
	// Entries are the libraries in the file's order, which is the order of
	// preference of the dynamic linker.
	Entries []Entry
}

// Parse reads a cache file's bytes. It never reads outside data: truncated
// or garbage input gives an error matching ErrInvalid (or ErrUnsupported for
// a cache of a layout it does not read).
func Parse(data []byte) (*Cache, error) {
	base := 0
	layout := LayoutNew
	if bytes.HasPrefix(data, []byte(magicOld)) {
		if len(data) < oldHeaderSize {
			return nil, invalid(int64(len(data)), "old header truncated")
		}
		n := uint64(binary.LittleEndian.Uint32(data[12:16]))
		end := uint64(oldHeaderSize) + n*oldEntrySize
		end = (end + newAlign - 1) &^ (newAlign - 1)
		if end > uint64(len(data)) {
			return nil, invalid(oldHeaderSize, "old layout claims %d entries, more than the %d bytes hold", n, len(data))
		}
		base = int(end)
		layout = LayoutCompat
		if !bytes.HasPrefix(data[base:], []byte(magicNew)) {
			return nil, &FormatError{Offset: int64(base), Reason: "old layout without the new one", Unsupported: true}
		}
	}
	c, err := parseNew(data, base)
	if err != nil {
		return nil, err
	}
	c.Layout = layout
	return c, nil
}

func parseNew(data []byte, base int) (*Cache, error) {
	hdr := data[base:]
	if len(hdr) < len(magicNew) || !bytes.Equal(hdr[:len(magicNew)], []byte(magicNew)) {
		return nil, invalid(int64(base), "no %q magic", magicNew)
	}
	if len(hdr) < newHeaderSize {
		return nil, invalid(int64(len(data)), "header truncated")
	}
	if v := string(hdr[len(magicNew) : len(magicNew)+len(version)]); v != version {
		return nil, &FormatError{Offset: int64(base + len(magicNew)), Reason: fmt.Sprintf("version %q", v), Unsupported: true}
	}
	var order binary.ByteOrder = binary.LittleEndian
	if hdr[28] == endianBig {
		order = binary.BigEndian
	}
	n := uint64(order.Uint32(hdr[20:24]))
	if end := uint64(newHeaderSize) + n*newEntrySize; end > uint64(len(hdr)) {
		return nil, invalid(int64(base+20), "%d entries need %d bytes, %d left", n, end, len(hdr))
	}
	c := &Cache{Entries: make([]Entry, 0, n)}
	for i := range int(n) {
		off := newHeaderSize + i*newEntrySize
		e := hdr[off : off+newEntrySize]
		key, err := cString(hdr, order.Uint32(e[4:8]))
		if err != nil {
			return nil, invalid(int64(base+off+4), "entry %d key: %v", i, err)
		}
		value, err := cString(hdr, order.Uint32(e[8:12]))
		if err != nil {
			return nil, invalid(int64(base+off+8), "entry %d value: %v", i, err)
		}
		c.Entries = append(c.Entries, Entry{
			Key:       key,
			Value:     value,
			Flags:     int32(order.Uint32(e[0:4])),
			OSVersion: order.Uint32(e[12:16]),
			HWCap:     order.Uint64(e[16:24]),
		})
	}
	return c, nil
}

// cString reads the NUL-terminated string at off in b.
func cString(b []byte, off uint32) (string, error) {
	if uint64(off) >= uint64(len(b)) {
		return "", fmt.Errorf("offset %d outside the %d bytes of the cache", off, len(b))
	}
	s := b[off:]
	end := bytes.IndexByte(s, 0)
	if end < 0 {
		return "", fmt.Errorf("string at offset %d has no terminating NUL", off)
	}
	return string(s[:end]), nil
}
