package deviceplugin

import (
	"encoding/binary"
	"errors"
)

// maxMsgpackDepth bounds the nesting of a configuration: the spec's is 2
// (an object of lists).
const maxMsgpackDepth = 32

var errMsgpackShape = errors.New("not a well-formed msgpack value")

// checkMsgpack walks the headers of data, one msgpack value, and refuses a
// string, array or map that claims more than the bytes left, nesting
// deeper than maxMsgpackDepth, a code msgpack never uses, and bytes after
// the value. The decoders allocate what a header claims before they read
// it: an 8-byte input claiming four billion elements would take the
// process's memory.
func checkMsgpack(data []byte) error {
	rest, err := skipMsgpack(data, 0)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return errMsgpackShape
	}
	return nil
}

// skipMsgpack returns what follows the value data begins with.
func skipMsgpack(data []byte, depth int) ([]byte, error) {
	if len(data) == 0 || depth > maxMsgpackDepth {
		return nil, errMsgpackShape
	}
	c, data := data[0], data[1:]
	// length reads an n-byte big-endian length.
	length := func(n int) (uint64, bool) {
		if len(data) < n {
			return 0, false
		}
		var v uint64
		switch n {
		case 1:
			v = uint64(data[0])
		case 2:
			v = uint64(binary.BigEndian.Uint16(data))
		case 4:
			v = uint64(binary.BigEndian.Uint32(data))
		}
		data = data[n:]
		return v, true
	}
	// bytes skips n bytes of payload.
	bytes := func(n uint64) ([]byte, error) {
		if n > uint64(len(data)) {
			return nil, errMsgpackShape
		}
		return data[n:], nil
	}
	// values skips n values, each at least one byte.
	values := func(n uint64) ([]byte, error) {
		if n > uint64(len(data)) {
			return nil, errMsgpackShape
		}
		var err error
		for range n {
			if data, err = skipMsgpack(data, depth+1); err != nil {
				return nil, err
			}
		}
		return data, nil
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3: // fixints, nil, booleans
		return data, nil
	case c <= 0x8f: // fixmap
		return values(2 * uint64(c&0x0f))
	case c <= 0x9f: // fixarray
		return values(uint64(c & 0x0f))
	case c <= 0xbf: // fixstr
		return bytes(uint64(c & 0x1f))
	}
	switch c {
	case 0xcc, 0xd0: // uint8, int8
		return bytes(1)
	case 0xcd, 0xd1: // uint16, int16
		return bytes(2)
	case 0xca, 0xce, 0xd2: // float32, uint32, int32
		return bytes(4)
	case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
		return bytes(8)
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: a type byte, then the data
		return bytes(1 + 1<<(c-0xd4))
	}
	var lenBytes int
	switch c {
	case 0xc4, 0xc7, 0xd9: // bin8, ext8, str8
		lenBytes = 1
	case 0xc5, 0xc8, 0xda, 0xdc, 0xde: // bin16, ext16, str16, array16, map16
		lenBytes = 2
	case 0xc6, 0xc9, 0xdb, 0xdd, 0xdf: // bin32, ext32, str32, array32, map32
		lenBytes = 4
	default: // 0xc1: never used
		return nil, errMsgpackShape
	}
	n, ok := length(lenBytes)
	if !ok {
		return nil, errMsgpackShape
	}
	switch c {
	case 0xc7, 0xc8, 0xc9: // ext: a type byte, then the data
		return bytes(n + 1)
	case 0xdc, 0xdd:
		return values(n)
	case 0xde, 0xdf:
		return values(2 * n)
	}
	return bytes(n)
}
