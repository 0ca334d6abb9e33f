// Prints a line to stderr, then panics: the Go runtime writes the panic and every goroutine's
// stack to stderr. The multiline test (tests/it/multiline.rs) runs it with `go run panic.go` and
// sends its stderr to a `lines` listener with `preset = "go"`.
package main

import (
	"fmt"
	"os"
)

func handle(items []int) int {
	return items[3]
}

func main() {
	fmt.Fprintln(os.Stderr, "go before")
	handle([]int{1})
}
