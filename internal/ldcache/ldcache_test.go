package ldcache

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the encoded fixtures and the fuzz seed corpus under testdata/")

// encodedEntries are the entries of the encoded-*.cache fixtures: 64- and
// 32-bit libraries of several architectures.
var encodedEntries = []Entry{
	{Key: "libcuda.so.1", Value: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Flags: FlagELFLibc6 | FlagX8664Lib64},
	{Key: "libcuda.so.1", Value: "/usr/lib/i386-linux-gnu/libcuda.so.1", Flags: FlagELFLibc6},
	{Key: "libnvidia-ml.so.1", Value: "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1", Flags: FlagELFLibc6 | FlagAArch64Lib64, HWCap: 1 << 40},
	{Key: "libnvidia-ml.so.1", Value: "/usr/lib/powerpc64le-linux-gnu/libnvidia-ml.so.1", Flags: FlagELFLibc6 | FlagPowerPCLib64, OSVersion: 0x030200},
	{Key: "libGL.so.1", Value: "/usr/lib/arm-linux-gnueabihf/libGL.so.1", Flags: FlagELFLibc6 | FlagARMLibHF},
	{Key: "libx32.so.1", Value: "/usr/libx32/libx32.so.1", Flags: FlagELFLibc6 | FlagX8664LibX32},
}

// ldconfigEntries are the entries of the ldconfig-*.cache fixtures, written by
// Debian's ldconfig (glibc 2.36) with -c compat and -c new for a tree holding
// two libraries in /lib64.
var ldconfigEntries = []Entry{
	{Key: "libnvidia-pkcs11-openssl3.so.535.309.01", Value: "/lib64/libnvidia-pkcs11-openssl3.so.535.309.01", Flags: FlagELFLibc6 | FlagX8664Lib64},
	{Key: "libGLX.so.0", Value: "/lib64/libGLX.so.0", Flags: FlagELFLibc6 | FlagX8664Lib64},
}

func TestMain(m *testing.M) {
	flag.Parse()
	if *update {
		if err := writeFixtures(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// writeFixtures writes the encoded fixtures and a fuzz seed for every
// fixture, plus a few broken seeds.
func writeFixtures() error {
	seeds := map[string][]byte{
		"empty":           {},
		"old-magic-only":  []byte(magicOld),
		"new-magic-only":  []byte(magicNew + version),
		"huge-count":      append([]byte(magicNew+version), 0xff, 0xff, 0xff, 0xff),
		"old-huge-count":  append([]byte(magicOld+"\x00"), 0xff, 0xff, 0xff, 0x0f),
		"wrong-version":   append([]byte(magicNew+"9.9"), make([]byte, 40)...),
		"garbage-strings": nil,
	}
	for _, layout := range []Layout{LayoutNew, LayoutCompat} {
		b, err := Encode(encodedEntries, layout)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join("testdata", "encoded-"+layout.String()+".cache"), b, 0o644); err != nil {
			return err
		}
		seeds["encoded-"+layout.String()] = b
	}
	g := bytes.Clone(seeds["encoded-new"])
	for i := newHeaderSize + 4; i < newHeaderSize+newEntrySize; i++ {
		g[i] = 0xee // key and value offsets far outside
	}
	seeds["garbage-strings"] = g
	for _, name := range []string{"ldconfig-new", "ldconfig-compat"} {
		b, err := os.ReadFile(filepath.Join("testdata", name+".cache"))
		if err != nil {
			return err
		}
		seeds[name] = b
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	for name, b := range seeds {
		seed := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(seed), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func TestParseFixtures(t *testing.T) {
	tests := []struct {
		file   string
		layout Layout
		want   []Entry
	}{
		{"ldconfig-new.cache", LayoutNew, ldconfigEntries},
		{"ldconfig-compat.cache", LayoutCompat, ldconfigEntries},
		{"encoded-new.cache", LayoutNew, encodedEntries},
		{"encoded-compat.cache", LayoutCompat, encodedEntries},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse(b)
			if err != nil {
				t.Fatal(err)
			}
			if c.Layout != tt.layout {
				t.Errorf("layout %v, want %v", c.Layout, tt.layout)
			}
			if !reflect.DeepEqual(c.Entries, tt.want) {
				t.Errorf("entries:\n got %+v\nwant %+v", c.Entries, tt.want)
			}
		})
	}
}

func TestEncodeMatchesLdconfig(t *testing.T) {
	// Encode lays a cache out as ldconfig does, except that ldconfig shares
	// string tails and appends an extension: compare what both parse to.
	for _, layout := range []Layout{LayoutNew, LayoutCompat} {
		b, err := Encode(ldconfigEntries, layout)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Parse(b)
		if err != nil {
			t.Fatalf("%v: %v", layout, err)
		}
		if c.Layout != layout || !reflect.DeepEqual(c.Entries, ldconfigEntries) {
			t.Errorf("%v: round trip gave %v %+v", layout, c.Layout, c.Entries)
		}
	}
	if _, err := Encode([]Entry{{Key: "a\x00b"}}, LayoutNew); !errors.Is(err, ErrInvalid) {
		t.Errorf("Encode(NUL in key) = %v, want ErrInvalid", err)
	}
}

func TestBits(t *testing.T) {
	tests := []struct {
		name  string
		flags int32
		want  int
	}{
		{"x86-64", FlagELFLibc6 | FlagX8664Lib64, 64},
		{"ppc64le", FlagELFLibc6 | FlagPowerPCLib64, 64},
		{"aarch64", FlagELFLibc6 | FlagAArch64Lib64, 64},
		{"i386", FlagELFLibc6, 32},
		{"x32", FlagELFLibc6 | FlagX8664LibX32, 32},
		{"armhf", FlagELFLibc6 | FlagARMLibHF, 32},
		{"unknown", FlagELFLibc6 | 0x7f00, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (Entry{Flags: tt.flags}).Bits(); got != tt.want {
				t.Errorf("Bits(%#x) = %d, want %d", tt.flags, got, tt.want)
			}
		})
	}
}

func TestParseInvalid(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "encoded-compat.cache"))
	if err != nil {
		t.Fatal(err)
	}
	newStart := bytes.Index(good, []byte(magicNew))
	badOffset := bytes.Clone(good)
	badOffset[newStart+newHeaderSize+4] = 0xff
	badOffset[newStart+newHeaderSize+7] = 0x7f
	unterminated := bytes.Clone(good[:len(good)-1])
	unterminated = append(unterminated, 'x')

	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrInvalid},
		{"garbage", []byte("this is not a cache file at all, not even close to one"), ErrInvalid},
		{"old header truncated", []byte(magicOld + "\x00\x01"), ErrInvalid},
		{"old entries truncated", good[:20], ErrInvalid},
		{"old layout alone", append([]byte(magicOld+"\x00"), 0, 0, 0, 0), ErrUnsupported},
		{"new header truncated", good[:newStart+30], ErrInvalid},
		{"new entries truncated", good[:newStart+newHeaderSize+10], ErrInvalid},
		{"string offset outside", badOffset, ErrInvalid},
		{"string unterminated", unterminated, ErrInvalid},
		{"unknown version", append([]byte(magicNew+"2.0"), make([]byte, 40)...), ErrUnsupported},
		{"huge entry count", append(append([]byte(magicNew+version), 0xff, 0xff, 0xff, 0xff), make([]byte, 24)...), ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse(tt.data)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Parse = %+v, %v; want %v", c, err, tt.want)
			}
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Offset < 0 || fe.Offset > int64(len(tt.data)) {
				t.Errorf("error %v is not a *FormatError with an offset inside the data", err)
			}
		})
	}
}

// TestParseEveryPrefix cuts the fixtures at every length: each cut either
// parses (the string table is shared) or gives ErrInvalid, and never panics.
func TestParseEveryPrefix(t *testing.T) {
	for _, name := range []string{"ldconfig-compat.cache", "encoded-compat.cache", "encoded-new.cache"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		for n := range len(b) {
			if _, err := Parse(b[:n]); err == nil && n < bytes.Index(b, []byte(magicNew))+newHeaderSize {
				t.Errorf("%s cut at %d parsed without its header", name, n)
			} else if err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupported) {
				t.Errorf("%s cut at %d: untyped error %v", name, n, err)
			}
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, layout := range []Layout{LayoutNew, LayoutCompat} {
		b, err := Encode(encodedEntries, layout)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(c.Entries)*newEntrySize > len(data) {
			t.Fatalf("%d entries from %d bytes", len(c.Entries), len(data))
		}
		// Whatever parses re-encodes to the same entries, unless a string
		// holds a NUL (it cannot: strings end at the first one).
		b, err := Encode(c.Entries, c.Layout)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if len(again.Entries) != len(c.Entries) || (len(c.Entries) > 0 && !reflect.DeepEqual(again.Entries, c.Entries)) {
			t.Fatalf("re-encoded entries differ:\n%+v\n%+v", again.Entries, c.Entries)
		}
	})
}

// bigEndian rewrites a little-endian new-layout cache as a big-endian host's
// ldconfig would write it.
func bigEndian(t *testing.T, le []byte) []byte {
	t.Helper()
	b := bytes.Clone(le)
	swap32 := func(off int) {
		b[off], b[off+1], b[off+2], b[off+3] = b[off+3], b[off+2], b[off+1], b[off]
	}
	n := int(b[20]) | int(b[21])<<8 | int(b[22])<<16 | int(b[23])<<24
	swap32(20)
	swap32(24)
	b[28] = endianBig
	for i := range n {
		e := newHeaderSize + i*newEntrySize
		for _, off := range []int{0, 4, 8, 12} {
			swap32(e + off)
		}
		for j := range 4 { // the uint64 hwcap
			b[e+16+j], b[e+23-j] = b[e+23-j], b[e+16+j]
		}
	}
	return b
}

func TestParseBigEndian(t *testing.T) {
	le, err := Encode(encodedEntries, LayoutNew)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(bigEndian(t, le))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Entries, encodedEntries) {
		t.Fatalf("big-endian entries:\n got %+v\nwant %+v", c.Entries, encodedEntries)
	}
}
