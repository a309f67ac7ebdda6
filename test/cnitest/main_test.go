package cnitest

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	RemoveBuild()
	os.Exit(code)
}
