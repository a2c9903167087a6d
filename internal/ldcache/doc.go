// Package ldcache reads the dynamic linker's cache, /etc/ld.so.cache.
//
// ldconfig writes the cache in one of two layouts:
//
//   - the new layout alone: a 48-byte header starting "glibc-ld.so.cache1.1",
//     then 24-byte entries, then the string table;
//   - the old layout first: an "ld.so-1.7.0" header and 12-byte entries, then,
//     aligned to 8 bytes, the whole new layout. Older glibc wrote this
//     "compat" form by default.
//
// Either way this package reads the entries of the new layout. Every entry maps
// a key (the soname, e.g. "libcuda.so.1") to a value (the path of the file that
// the linker loads for it) and carries flags telling the library's kind and
// architecture, and so whether it is a 32- or 64-bit library.
//
// [Parse] is pure: it takes the file's bytes and never reads outside them.
// Truncated or garbage input gives an error matching [ErrInvalid]; it never
// panics. [Encode] writes a cache in either layout, as ldconfig would, so that
// tests can build driver trees of their own.
package ldcache
