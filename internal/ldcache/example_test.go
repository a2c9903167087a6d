package ldcache_test

import (
	"fmt"

	"github.com/gpuiso/gpuiso/internal/ldcache"
)

func ExampleParse() {
	data, err := ldcache.Encode([]ldcache.Entry{
		{Key: "libcuda.so.1", Value: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Flags: ldcache.FlagELFLibc6 | ldcache.FlagX8664Lib64},
		{Key: "libcuda.so.1", Value: "/usr/lib/i386-linux-gnu/libcuda.so.1", Flags: ldcache.FlagELFLibc6},
	}, ldcache.LayoutCompat)
	if err != nil {
		fmt.Println(err)
		return
	}
	c, err := ldcache.Parse(data) // in real use: the bytes of /etc/ld.so.cache
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range c.Entries {
		fmt.Printf("%s (%d-bit) => %s\n", e.Key, e.Bits(), e.Value)
	}
	// Output:
	// libcuda.so.1 (64-bit) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
	// libcuda.so.1 (32-bit) => /usr/lib/i386-linux-gnu/libcuda.so.1
}
