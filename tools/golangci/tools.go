//go:build tools

// Package tools pins golangci-lint, which `make lint` builds with
// scripts/golangci-lint.sh.
package tools

import _ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
