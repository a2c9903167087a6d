package ldcache

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Encode writes entries as a little-endian cache file in the given layout,
// the way ldconfig lays it out. Keys and values may not hold NUL bytes.
func Encode(entries []Entry, layout Layout) ([]byte, error) {
	for i, e := range entries {
		if strings.IndexByte(e.Key, 0) >= 0 || strings.IndexByte(e.Value, 0) >= 0 {
			return nil, fmt.Errorf("encode entry %d: NUL byte in key or value: %w", i, ErrInvalid)
		}
	}
	le := binary.LittleEndian

	// The new layout: header, entries, strings. Offsets count from its header.
	strOff := newHeaderSize + len(entries)*newEntrySize
	var strs []byte
	offsets := make([][2]uint32, len(entries))
	for i, e := range entries {
		offsets[i][0] = uint32(strOff + len(strs))
		strs = append(append(strs, e.Key...), 0)
		offsets[i][1] = uint32(strOff + len(strs))
		strs = append(append(strs, e.Value...), 0)
	}
	nw := make([]byte, strOff, strOff+len(strs))
	copy(nw, magicNew+version)
	le.PutUint32(nw[20:], uint32(len(entries)))
	le.PutUint32(nw[24:], uint32(len(strs)))
	nw[28] = endianLittle
	for i, e := range entries {
		b := nw[newHeaderSize+i*newEntrySize:]
		le.PutUint32(b[0:], uint32(e.Flags))
		le.PutUint32(b[4:], offsets[i][0])
		le.PutUint32(b[8:], offsets[i][1])
		le.PutUint32(b[12:], e.OSVersion)
		le.PutUint64(b[16:], e.HWCap)
	}
	nw = append(nw, strs...)
	if layout == LayoutNew {
		return nw, nil
	}

	// The old layout first. ldconfig gives its entries the same string
	// offsets as the new ones: the strings are shared.
	oldLen := oldHeaderSize + len(entries)*oldEntrySize
	pad := (oldLen+newAlign-1)&^(newAlign-1) - oldLen
	old := make([]byte, oldLen+pad, oldLen+pad+len(nw))
	copy(old, magicOld)
	le.PutUint32(old[12:], uint32(len(entries)))
	for i, e := range entries {
		b := old[oldHeaderSize+i*oldEntrySize:]
		le.PutUint32(b[0:], uint32(e.Flags))
		le.PutUint32(b[4:], offsets[i][0])
		le.PutUint32(b[8:], offsets[i][1])
	}
	return append(old, nw...), nil
}
