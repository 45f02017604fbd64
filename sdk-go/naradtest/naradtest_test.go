package naradtest_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	narad "github.com/narad-mq/narad/sdk-go"
	"github.com/narad-mq/narad/sdk-go/naradtest"
)

// buildNarad builds the broker of this repository, for the tests of this package.
func buildNarad(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "narad")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/narad")
	cmd.Dir = filepath.Join("..", "..", "broker")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building narad: %v\n%s", err, out)
	}
	return bin
}

func TestStartServesAndStops(t *testing.T) {
	bin := buildNarad(t)
	var srv *naradtest.Server
	t.Run("inner", func(t *testing.T) {
		t.Setenv("NARAD_BIN", bin)
		srv = naradtest.Start(t)
		c, err := narad.New([]string{srv.URL})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.CreateTopic(ctx, "t", narad.TopicConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Produce(ctx, "t", "hello"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(srv.DataDir); err != nil {
			t.Fatal(err)
		}
	})
	// The inner test's cleanup stopped the broker.
	if _, err := http.Get(srv.URL + "/readyz"); err == nil {
		t.Fatal("the broker still answers after its test ended")
	}
}
