// Package linux is the only package of gpuiso that imports golang.org/x/sys/unix.
//
// It wraps the few kernel interfaces the library needs (device numbers, device
// node creation, file system types) behind small functions. On other operating
// systems every function returns an error matching [ErrNotSupported], so the
// rest of the module compiles and degrades to a typed "not supported" result.
package linux
