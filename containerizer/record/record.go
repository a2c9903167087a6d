// Package record is the record store's old path: the store moved to
// package github.com/gpuiso/gpuiso/record, below the isolators, so that
// every package that keeps state across a restart uses the one store.
// The names here are the new package's (aliases and forwarders: an
// error of one matches the sentinels of the other), for one release.
//
// Deprecated: import github.com/gpuiso/gpuiso/record.
package record

import (
	"github.com/gpuiso/gpuiso/record"
)

// Phase is record.Phase.
type Phase = record.Phase

// Phases of an entry: record.Started and record.Completed.
const (
	Started   = record.Started
	Completed = record.Completed
)

// Entry is record.Entry.
type Entry[T any] = record.Entry[T]

// Options is record.Options.
type Options[T any] = record.Options[T]

// Store is record.Store.
type Store[T any] = record.Store[T]

// CorruptError is record.CorruptError.
type CorruptError = record.CorruptError

// MaxKeyLen is record.MaxKeyLen.
const MaxKeyLen = record.MaxKeyLen

// The sentinels of package record, the same values.
var (
	ErrCorrupt        = record.ErrCorrupt
	ErrNoRecord       = record.ErrNoRecord
	ErrInvalidKey     = record.ErrInvalidKey
	ErrInvalidOptions = record.ErrInvalidOptions
	ErrInvalidEntry   = record.ErrInvalidEntry
	ErrNotMade        = record.ErrNotMade
)

// New is record.New.
func New[T any](dir string, o Options[T]) (*Store[T], error) { return record.New(dir, o) }

// ValidKey is record.ValidKey.
func ValidKey(key string) error { return record.ValidKey(key) }
