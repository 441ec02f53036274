package fairlock

import (
	"os"
	"strings"
	"testing"
)

// The README's quickstart is examples/quickstart, which go vet and go
// build check; this keeps the two identical.
func TestReadmeQuickstart(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	code, err := os.ReadFile("examples/quickstart/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```go\n"+string(code)+"```\n") {
		t.Fatal("README.md does not contain examples/quickstart/main.go verbatim in a go block")
	}
}
