package dra

// WriteCheckpoint records c in dir as the driver would, for tests that
// stage a cut-short preparation.
func WriteCheckpoint(dir string, c Checkpoint) error { return checkpoints{dir: dir}.write(c) }

func ReadCheckpoint(dir, uid string) (Checkpoint, error) {
	c, _, err := checkpoints{dir: dir}.read(uid)
	return c, err
}
