package narad

import "testing"

func view(cluster, id string, members ...string) *clusterView {
	v := &clusterView{ClusterID: cluster, NodeID: id}
	for _, m := range members {
		v.Members = append(v.Members, struct {
			ID string `json:"id"`
		}{ID: m})
	}
	return v
}

func TestOneCluster(t *testing.T) {
	cases := []struct {
		name  string
		views []*clusterView
		want  bool
	}{
		{"no answers", []*clusterView{nil, nil}, true},
		{"one answer", []*clusterView{view("", "a", "a"), nil}, true},
		{"same node twice", []*clusterView{view("", "a", "a"), view("", "a", "a")}, true},
		{"members of each other", []*clusterView{view("", "a", "a", "b"), view("", "b", "a", "b")}, true},
		{"independent nodes", []*clusterView{view("", "a", "a"), view("", "b", "b")}, false},
		{"one-sided membership", []*clusterView{view("", "a", "a", "b"), view("", "b", "b")}, false},
		{"same cluster id", []*clusterView{view("c1", "a", "a"), view("c1", "b", "b")}, true},
		{"different cluster ids", []*clusterView{view("c1", "a", "a", "b"), view("c2", "b", "a", "b")}, false},
		{"id missing on one falls back to members", []*clusterView{view("c1", "a", "a", "b"), view("", "b", "a", "b")}, true},
	}
	for _, tc := range cases {
		if got := oneCluster(tc.views); got != tc.want {
			t.Errorf("%s: oneCluster = %v, want %v", tc.name, got, tc.want)
		}
	}
}
