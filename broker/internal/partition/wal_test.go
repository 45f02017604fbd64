package partition

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"

	"github.com/narad-mq/narad/broker/internal/storage/segment"
	"github.com/narad-mq/narad/broker/internal/storage/vfs"
	"github.com/narad-mq/narad/broker/internal/storage/wal"
)

// TestWALPowerLoss: a partition whose log and journal appends are made durable by the
// node's write-ahead file (--sync-mode wal) never syncs those files itself. After a
// power cut, the write-ahead file's replay must bring back every append answered
// and every settle answered: no answered message lost, no settled one delivered
// again. Concurrent producers and settlers over small write-ahead files, so that
// rotations and checkpoints run during the load; the cut tears unsynced tails.
func TestWALPowerLoss(t *testing.T) {
	for seed := int64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) { walPowerLoss(t, seed) })
	}
}

func openWAL(t *testing.T, fs *vfs.Mem) (*wal.WAL, wal.Replayed) {
	t.Helper()
	w, rep, err := wal.Open("/wal", wal.Options{FS: fs, Root: "/", FileBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	return w, rep
}

func walPowerLoss(t *testing.T, seed int64) {
	fs := vfs.NewMem()
	w, _ := openWAL(t, fs)
	p := mustOpen(t, fs, func(o *Options) { o.WAL = w })
	const producers, each = 4, 150
	var (
		mu      sync.Mutex
		stored  = map[string]bool{} // values answered
		settled = map[string]bool{} // values whose settle was answered
		wg      sync.WaitGroup
	)
	for g := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				v := fmt.Sprintf("g%d-%d", g, i)
				if _, err := p.Append([]segment.Record{{Value: []byte(v)}}); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				stored[v] = true
				mu.Unlock()
			}
		}()
	}
	produced := make(chan struct{})
	go func() { wg.Wait(); close(produced) }()
	var swg sync.WaitGroup
	swg.Add(1)
	go func() { // settles what is there while the producers run, up to half of it
		defer swg.Done()
		for n := 0; n < producers*each/2; {
			ds, err := p.Lease(20, testQueue.Visibility, 1<<20)
			if err != nil {
				t.Error(err)
				return
			}
			select {
			case <-produced:
				if len(ds) == 0 {
					return
				}
			default:
			}
			n += len(ds)
			reqs := make([]SettleReq, len(ds))
			for i, d := range ds {
				reqs[i] = SettleReq{Offset: d.Record.Offset, Nonce: d.Nonce}
			}
			for i, err := range p.Settle(reqs) {
				if err == nil {
					mu.Lock()
					settled[string(ds[i].Record.Value)] = true
					mu.Unlock()
				}
			}
		}
	}()
	<-produced
	swg.Wait()
	if t.Failed() {
		return
	}
	if s := w.Stats(); s.Checkpoints == 0 {
		t.Fatalf("no checkpoint ran during the load (stats %+v): the test does not cover them", s)
	}
	if fs.Syncs() == 0 {
		t.Fatal("nothing was synced")
	}
	// Cut the power: unsynced bytes go (some torn), the process's handles die.
	fs.CrashTorn(rand.New(rand.NewSource(seed)))
	p.closeFiles()

	_, rep := openWAL(t, fs)
	if rep.Records == 0 {
		t.Fatalf("the replay redid nothing (%+v): the appends did not rely on it", rep)
	}
	p = mustOpen(t, fs)
	defer p.Close()
	seen := map[string]bool{}
	for _, d := range leaseAll(t, p) {
		v := string(d.Record.Value)
		if settled[v] {
			t.Errorf("%s was settled before the cut and is delivered again", v)
		}
		seen[v] = true
	}
	for v := range stored {
		if !settled[v] && !seen[v] {
			t.Errorf("%s was answered before the cut and is lost", v)
		}
	}
	t.Logf("seed %d: %d stored, %d settled, replay %+v", seed, len(stored), len(settled), rep)
}
