// Package iox holds the io helpers that the snapshot decoders of package
// shard and package guard share.
package iox

import (
	"errors"
	"io"
)

// Unexpected turns a clean end of input, met in the middle of an encoding,
// into io.ErrUnexpectedEOF: the encoding is truncated, not empty.
func Unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
