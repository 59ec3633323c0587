package election

import (
	"flag"
	"os"
	"testing"
)

// TestMain runs up to four of these tests at once unless -parallel is
// given: they spend most of their time waiting (30 s between machine
// deletions, seconds of watching after each fault), each in a lab of its
// own, so four at a time keep the package near two minutes on two cores
// instead of four.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		_ = flag.Set("test.parallel", "4")
	}
	os.Exit(m.Run())
}
