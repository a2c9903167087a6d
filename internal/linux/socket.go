package linux

import "github.com/gpuiso/gpuiso/node"

// ErrNotSocket is returned by OpenSocketPath for a path that holds
// something other than a UNIX socket (a link to one included).
var ErrNotSocket = node.Sentinel(node.ErrInvalid, "not a socket")
