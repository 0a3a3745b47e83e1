package faults_test

import (
	"os"
	"testing"

	"github.com/stockgate/stockgate/e2e/systest"
)

func TestMain(m *testing.M) { os.Exit(systest.Main(m)) }
