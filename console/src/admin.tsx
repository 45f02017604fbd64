// The cluster's members, and users with their grants (admins only: the API says so).
import { useState } from "preact/hooks";
import { ApiError, api, type Cluster, enc, type NodeHealth, type TopicStatsList, type User } from "./api";
import { bytes, duration, grantsText, millis, parseGrants } from "./format";
import { ErrorNote, Note, useConfirm, useInOrder, usePoll } from "./ui";

export function ClusterPage() {
  const [c, setC] = useState<Cluster | null>(null);
  // undefined: not read yet; null: for admins only; an Error: the read failed.
  const [health, setHealth] = useState<NodeHealth | Error | null | undefined>(undefined);
  const [error, setError] = useState<unknown>(null);
  const begin = useInOrder();
  usePoll(
    async () => {
      // A refresh answered late (a slow node) is not shown over a newer one: it would
      // put back the members as they were before.
      const current = begin();
      try {
        const got = await api<Cluster>("GET", "/v1/cluster");
        if (!current()) return;
        setC(got);
        setError(null);
      } catch (e) {
        if (current()) setError(e);
        return;
      }
      try {
        // node_health comes with the stats route, for admins only.
        const got = (await api<TopicStatsList>("GET", "/v1/stats")).node_health ?? null;
        if (current()) setHealth(got);
      } catch (e) {
        // A refusal says the figures are for admins; any other failure is shown as such.
        if (current()) setHealth(e instanceof ApiError && e.status === 403 ? null : e instanceof Error ? e : new Error(String(e)));
      }
    },
    5000,
    [],
  );
  return (
    <section aria-labelledby="cluster-h">
      <h1 id="cluster-h">Cluster</h1>
      <ErrorNote error={error} />
      {c ? (
        <>
          <dl class="settings">
            <dt>This node</dt>
            <dd>{c.node_id}</dd>
            <dt>Controller</dt>
            <dd>{c.controller || "none (no quorum)"}</dd>
            {c.cluster_id ? (
              <>
                <dt>Cluster id</dt>
                <dd>{c.cluster_id}</dd>
              </>
            ) : null}
          </dl>
          <NodeHealthView health={health} />
          <div class="scroll">
            <table>
              <caption>Members</caption>
              <thead>
                <tr>
                  <th scope="col">Node</th>
                  <th scope="col">Status</th>
                  <th scope="col">Voter</th>
                  <th scope="col">Partitions held</th>
                  <th scope="col">Partitions led</th>
                  <th scope="col">HTTP address</th>
                  <th scope="col">Node address</th>
                </tr>
              </thead>
              <tbody>
                {c.members.map((m) => (
                  <tr key={m.id}>
                    <th scope="row">
                      {m.id}
                      {m.id === c.controller ? <span class="tag">controller</span> : null}
                    </th>
                    <td>
                      <span class={`status ${m.status}`}>{m.status}</span>
                    </td>
                    <td>{m.voter ? "yes" : "no"}</td>
                    <td class="num">{m.partitions_held ?? "–"}</td>
                    <td class="num">{m.partitions_led ?? "–"}</td>
                    <td>{m.http_address ?? "–"}</td>
                    <td>{m.address || "–"}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </>
      ) : null}
    </section>
  );
}

/** The answering node's readiness, disk and sync rounds (from GET /v1/stats). */
const syncModeText: Record<NodeHealth["sync_mode"], string> = {
  wal: "wal (every partition's appends share one write-ahead file)",
  group: "group (partitions share sync rounds)",
  file: "file (each write syncs its own file)",
};

function NodeHealthView({ health }: { health: NodeHealth | Error | null | undefined }) {
  if (health === undefined) return null;
  if (health instanceof Error) {
    return (
      <section aria-labelledby="health-h">
        <h2 id="health-h">This node's health</h2>
        <ErrorNote error={health} />
      </section>
    );
  }
  if (health === null) {
    return (
      <section aria-labelledby="health-h">
        <h2 id="health-h">This node's health</h2>
        <p>The node's health and storage are shown to admins only (as /metrics is).</p>
      </section>
    );
  }
  const free = health.disk_free_bytes;
  const size = health.disk_size_bytes;
  const s = health.sync;
  return (
    <section aria-labelledby="health-h">
      <h2 id="health-h">This node's health</h2>
      <dl class="settings" aria-label="Node health">
        <dt>Node</dt>
        <dd>{health.id}</dd>
        <dt>Ready</dt>
        <dd>
          <span class={`status ${health.ready ? "alive" : "dead"}`}>{health.ready ? "ready" : "not ready"}</span>
        </dd>
        <dt>Disk free</dt>
        <dd data-health="disk">
          {free !== undefined && size !== undefined && size > 0 ? (
            <>
              {bytes(free)} of {bytes(size)} ({((free / size) * 100).toFixed(0)}% free){" "}
              <meter min={0} max={size} value={size - free} low={size * 0.8} high={size * 0.9} optimum={0} aria-label="disk used" />
            </>
          ) : (
            "unknown"
          )}
        </dd>
        <dt>Sync mode</dt>
        <dd>{syncModeText[health.sync_mode]}</dd>
        {s ? (
          <>
            <dt>Sync rounds, last {duration(s.interval_ms)}</dt>
            <dd data-health="sync">
              {s.rounds} rounds ({s.rounds_per_second.toFixed(1)}/s, {s.files} files): mean {millis(s.mean_ms)}, longest {millis(s.max_ms)}
            </dd>
          </>
        ) : health.sync_mode !== "file" ? (
          <>
            <dt>Sync rounds</dt>
            <dd>none sampled yet</dd>
          </>
        ) : null}
      </dl>
    </section>
  );
}

export function UsersPage() {
  const [users, setUsers] = useState<User[] | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [actionError, setActionError] = useState<unknown>(null);
  const [note, setNote] = useState("");
  const [edits, setEdits] = useState<Record<string, string>>({});
  const [name, setName] = useState("");
  const [password, setPassword] = useState("");
  const [grants, setGrants] = useState("");
  const [dialog, ask] = useConfirm();
  const begin = useInOrder();
  const load = async () => {
    // A read answered late is not shown over a newer one: it would put back the users
    // as they were before (a user just created gone, one just deleted back).
    const current = begin();
    try {
      const got = (await api<{ users: User[] }>("GET", "/v1/users")).users;
      if (!current()) return;
      setUsers(got);
      setError(null);
    } catch (e) {
      if (current()) setError(e);
    }
  };
  usePoll(load, 15000, []);
  const act = async (what: string, action: string, run: () => Promise<unknown>, done: string) => {
    setActionError(null);
    setNote("");
    if (!(await ask(what, action))) return;
    try {
      await run();
      setNote(done);
      load();
    } catch (e) {
      setActionError(e);
    }
  };
  const withGrants = (text: string, then: (g: ReturnType<typeof parseGrants>) => void) => {
    try {
      then(parseGrants(text));
    } catch (e) {
      setActionError(e);
    }
  };
  return (
    <section aria-labelledby="users-h">
      <h1 id="users-h">Users</h1>
      <p>Grants are written <code>action: topic, topic; action: topic</code>, e.g. <code>consume: orders.*; produce: orders.eu</code>.</p>
      <ErrorNote error={error} />
      {users ? (
        <div class="scroll">
          <table>
            <thead>
              <tr>
                <th scope="col">User</th>
                <th scope="col">Grants</th>
                <th scope="col">Actions</th>
              </tr>
            </thead>
            <tbody>
              {users.map((u) => (
                <tr key={u.username}>
                  <th scope="row">{u.username}</th>
                  <td>
                    <label class="inline">
                      <span class="sr-only">Grants of {u.username}</span>
                      <input
                        name={`grants-${u.username}`}
                        value={edits[u.username] ?? grantsText(u.grants)}
                        onInput={(e) => setEdits({ ...edits, [u.username]: e.currentTarget.value })}
                      />
                    </label>
                  </td>
                  <td>
                    <button
                      type="button"
                      onClick={() =>
                        withGrants(edits[u.username] ?? grantsText(u.grants), (g) =>
                          act(`Replace the grants of ${u.username} with: ${grantsText(g) || "none"}?`, "Replace grants", () => api("PUT", `/v1/users/${enc(u.username)}/grants`, { grants: g }), `Changed the grants of ${u.username}.`),
                        )
                      }
                    >
                      Save grants
                    </button>{" "}
                    <button
                      type="button"
                      class="danger"
                      aria-label={`Delete user ${u.username}`}
                      onClick={() =>
                        act(`Delete user ${u.username}? Their credentials stop working; topics they own keep their data.`, "Delete user", () => api("DELETE", `/v1/users/${enc(u.username)}`), `Deleted user ${u.username}.`)
                      }
                    >
                      Delete
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
      <form
        class="card"
        aria-labelledby="user-h"
        onSubmit={(e) => {
          e.preventDefault();
          withGrants(grants, (g) =>
            act(`Create user ${name.trim()} with grants: ${grantsText(g) || "none"}?`, "Create user", () => api("POST", "/v1/users", { username: name.trim(), password, grants: g }), `Created user ${name.trim()}.`).then(() => setPassword("")),
          );
        }}
      >
        <h2 id="user-h">Create a user</h2>
        <div class="fields">
          <label>
            Username
            <input name="username" required value={name} onInput={(e) => setName(e.currentTarget.value)} autocomplete="off" />
          </label>
          <label>
            Password (8 to 72 characters)
            <input name="new-password" type="password" required value={password} onInput={(e) => setPassword(e.currentTarget.value)} autocomplete="new-password" />
          </label>
          <label>
            Grants
            <input name="grants" value={grants} onInput={(e) => setGrants(e.currentTarget.value)} placeholder="consume: orders.*" />
          </label>
        </div>
        <button type="submit">Create user</button>
      </form>
      <ErrorNote error={actionError} />
      <Note text={note} />
      {dialog}
    </section>
  );
}
