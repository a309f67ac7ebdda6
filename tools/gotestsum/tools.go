//go:build tools

// Package tools pins gotestsum, which `make test` runs its test packages
// through (scripts/gotestsum.sh builds it): it prints each test as it ends,
// so a long package is not a silent console, and names every failed test
// with its output in the summary at the end.
package tools

import _ "gotest.tools/gotestsum"
