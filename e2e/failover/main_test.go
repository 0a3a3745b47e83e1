package failover_test

import (
	"os"
	"testing"

	"github.com/stockgate/stockgate/internal/systest"
)

func TestMain(m *testing.M) { os.Exit(systest.Main(m)) }
