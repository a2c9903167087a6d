package simnode

// The names of a host tree's marks, for the external tests.
const (
	MarkerName   = markerName
	CompleteName = completeName
	LockName     = lockName
)
