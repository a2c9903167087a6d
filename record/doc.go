// Package record is the one store of what must outlive a process of
// gpuiso: the allocator's state, a container's record (package
// containerizer/native, the chain isolator of package
// containerizer/chain), an MPS daemon's record, a runtime's claim and a
// Kubernetes claim's checkpoint (the DRA driver of the kubernetes
// module). It sits below every package that keeps such state, and
// imports only the node model. It is public so that the kubernetes
// module, which builds against the published core, uses it as every
// other caller does.
//
// # Model
//
// A [Store] is a directory of one file per key (a container id, a claim
// uid), "<key>.json", or "<key>/<Options.Name>" for a store whose keys own
// a directory of their own. Each file holds one [Entry]: the user's data
// (any JSON-encodable type T), the key, the phase and, where there is one,
// the process the entry belongs to ([node.Process], the module's one
// process identity: a container's init, an allocation's holder).
//
// A [File] is one entry in a file of its own at a path its caller names
// (the allocator's "allocations.json", a daemon's record in the daemon's
// directory), written, read and checked as a Store's entries are. A
// [Codec] is the format alone, encoding an entry to the bytes of its
// file and decoding them back, for a caller that keeps the bytes it
// wrote or reads them itself.
//
// Phases are two: [Started] is written before anything is taken (a crash
// from there on leaves what was taken findable) and [Completed] once the
// work is done and its caller told; a reader that finds a Started entry
// after a restart undoes what it names.
//
// # On disk
//
// An entry is JSON: the store's format name and version, the key, the
// phase, the process, the data and a SHA-256 checksum of the rest:
//
//	{"format":"gpuiso-dra-claim","version":3,"key":"<uid>","phase":"completed",
//	 "data":{...},"checksum":"<hex>"}
//
// A write replaces the file atomically: a temporary file in the same
// directory, written, synced, renamed over the old one, and the directory
// synced; the temporary file's name, ".<file>.<pid>.<random>.tmp", says
// which process left it. [Options.NoSync] leaves out the two syncs for
// entries that describe running processes, which no machine crash
// outlives; the replacement stays atomic against the writer's death. A
// file that does not parse, is of another format or a newer version,
// records another key, names an unknown phase or fails its checksum is
// refused with a [*CorruptError] (matching [ErrCorrupt] and
// node.ErrCorrupt); a missing one is [ErrNoRecord] (matching
// node.ErrNotFound).
//
// # Older files
//
// The files its users wrote before the store keep their names and places,
// and [Options.Legacy] reads their old shapes: an upgrade loses no
// prepared claim and no running container. The next write of such an
// entry writes it in the store's format.
//
// # Who owns what
//
// The store owns the files of its keys and their temporary files; the
// directory, its lock (if any) and anything else in it are the caller's.
// It has no lock of its own: one writer per key at a time is the caller's
// rule (each of its users holds a mutex or a directory lock).
//
// A Store not made with [New] (its zero value) refuses every call with
// [ErrNotMade], and only a store of an absolute directory writes: one of a
// relative directory reads and parses, and refuses to write, remove or
// clean ([ErrInvalidOptions]), so that no entry lands in whatever
// directory the process runs in. A write into a directory that does not
// exist matches node.ErrNotFound.
package record
