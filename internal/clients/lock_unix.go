//go:build unix

package clients

import (
	"os"
	"path/filepath"
	"syscall"
)

// buildLock takes a lock that the test processes of one machine share,
// so that two packages' tests (internal/robustness, internal/faulttest)
// building the same binaries at once build them one after the other: the
// second then finds every package compiled in the go command's cache and
// only links. It returns the function that releases it.
func buildLock() (func(), error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "fairlock-clients-build.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}
