// The topics list and one topic: partitions, children, admin actions.
import { useState } from "preact/hooks";
import { api, type Child, enc, type Topic, type TopicDetail, type TopicStats } from "./api";
import { duration, rate } from "./format";
import { ErrorNote, href, Note, Sparkline, useConfirm, useInOrder, usePoll } from "./ui";

const refreshMs = 5000;

function sum(d: TopicDetail | undefined, f: (p: TopicDetail["partition_stats"][number]) => number): number | undefined {
  return d ? d.partition_stats.reduce((a, p) => a + f(p), 0) : undefined;
}

/**
 * The partitions of d the broker could not read (available false: their node could not
 * be reached, or their replica is handing its leadership over). Their counters come as
 * 0, which are not figures: the console shows them as unknown.
 */
function unavailable(d: TopicDetail | undefined): number[] {
  return d ? d.partition_stats.filter((p) => p.available === false).map((p) => p.partition) : [];
}

const unavailableWhy = "its node could not be reached, or its leadership is being handed over";

function UnavailableNote({ partitions }: { partitions: number[] }) {
  if (partitions.length === 0) return null;
  return (
    <p class="error" role="alert">
      {partitions.length === 1
        ? `Partition ${partitions[0]} is unavailable (${unavailableWhy}): its figures, and so the topic's totals, are unknown.`
        : `Partitions ${partitions.join(", ")} are unavailable (for each, ${unavailableWhy}): their figures, and so the topic's totals, are unknown.`}
    </p>
  );
}

/**
 * Says that a read of the stats route failed, with the API's error, in place of the
 * trends: without it a failed read looks like a quiet topic. at: when the lines still
 * shown were read (they are stale), or null when none were ever read.
 */
function TrendsError({ error, at }: { error: unknown; at: number | null }) {
  const what =
    at === null
      ? "The trends could not be read"
      : `The trends could not be read; the lines and rates shown are stale, as read at ${new Date(at).toLocaleTimeString()}`;
  return <ErrorNote error={error} what={what} />;
}

export function TopicsPage() {
  const [topics, setTopics] = useState<Topic[] | null>(null);
  const [details, setDetails] = useState<Record<string, TopicDetail>>({});
  // The topics whose detail read failed, with the API's answer: shown in their row in
  // place of figures, which would otherwise read as blank or 0.
  const [failed, setFailed] = useState<Record<string, unknown>>({});
  const [stats, setStats] = useState<Record<string, TopicStats>>({});
  // A failed stats read keeps the last trends read (statsAt: when; null: none yet),
  // shown as stale beside the error.
  const [statsError, setStatsError] = useState<unknown>(null);
  const [statsAt, setStatsAt] = useState<number | null>(null);
  const [error, setError] = useState<unknown>(null);
  const begin = useInOrder();
  const load = async () => {
    // A refresh answered late (a slow node) is not shown over a newer one: it would put
    // back the list as it was before, a topic just created gone from it.
    const current = begin();
    try {
      const list = (await api<{ topics: Topic[] }>("GET", "/v1/topics")).topics;
      // Current figures from each topic (at most 100 asked per refresh); trends from the
      // stats route in one request.
      const asked = list.slice(0, 100);
      const got = await Promise.allSettled(asked.map((t) => api<TopicDetail>("GET", `/v1/topics/${enc(t.name)}`)));
      const d: Record<string, TopicDetail> = {};
      const f: Record<string, unknown> = {};
      got.forEach((r, i) => {
        if (r.status === "fulfilled") d[r.value.name] = r.value;
        else f[asked[i].name] = r.reason;
      });
      // A failed stats read does not stop the list and its current figures.
      let st: TopicStats[] | null = null;
      let stError: unknown = null;
      try {
        st = (await api<{ topics: TopicStats[] }>("GET", "/v1/stats")).topics;
      } catch (e) {
        stError = e;
      }
      if (!current()) return;
      setTopics(list);
      setDetails(d);
      setFailed(f);
      if (st) {
        const s: Record<string, TopicStats> = {};
        for (const t of st) s[t.topic] = t;
        setStats(s);
        setStatsAt(Date.now());
      }
      setStatsError(stError);
      setError(null);
    } catch (e) {
      if (current()) setError(e);
    }
  };
  usePoll(load, refreshMs, []);
  return (
    <section aria-labelledby="topics-h">
      <h1 id="topics-h">Topics</h1>
      <ErrorNote error={error} />
      {topics && topics.length > 0 && statsError ? <TrendsError error={statsError} at={statsAt} /> : null}
      {topics === null ? (
        <p>Loading…</p>
      ) : topics.length === 0 ? (
        <p>No topics you may see.</p>
      ) : (
        <div class="scroll">
          <table class="topics">
            <caption class="sr-only">Topics you may see, with their backlog and recent rates</caption>
            <thead>
              <tr>
                <th scope="col">Topic</th>
                <th scope="col">Partitions</th>
                <th scope="col">Backlog</th>
                <th scope="col">In flight</th>
                <th scope="col">Oldest unacked</th>
                <th scope="col">Produce rate</th>
                <th scope="col">Ack rate</th>
                <th scope="col">Backlog trend</th>
              </tr>
            </thead>
            <tbody>
              {topics.map((t) => {
                const d = details[t.name];
                const down = unavailable(d);
                // A total over partitions some of which could not be read is no total.
                const figures = failed[t.name] || down.length > 0 ? "unknown" : "–";
                const known = down.length === 0 ? d : undefined;
                const s = stats[t.name]?.samples ?? [];
                const last = s[s.length - 1];
                // Figures from a stats read that failed, never made: unknown, not 0/s.
                const never = statsError && statsAt === null;
                const stale = statsError ? "stale" : undefined;
                return (
                  <tr key={t.name} data-topic={t.name}>
                    <th scope="row">
                      <a href={href("topics", t.name)}>{t.name}</a>
                      {t.parent ? <span class="tag">child of {t.parent}</span> : null}
                      <ErrorNote error={failed[t.name]} />
                      <UnavailableNote partitions={down} />
                    </th>
                    <td>{t.partitions}</td>
                    <td class="num" data-col="backlog">
                      {sum(known, (p) => p.backlog) ?? figures}
                    </td>
                    <td class="num" data-col="in-flight">
                      {sum(known, (p) => p.in_flight) ?? figures}
                    </td>
                    <td class={`num ${stale ?? ""}`}>{never ? "unknown" : last ? duration(last.oldest_unacked_age_ms) : "–"}</td>
                    {never ? (
                      <>
                        <td data-col="produce-rate">unknown</td>
                        <td data-col="ack-rate">unknown</td>
                        <td data-col="backlog-trend">unknown</td>
                      </>
                    ) : (
                      <>
                        <td data-col="produce-rate" class={stale}>
                          <Sparkline values={s.map((x) => x.produce_rate)} label={`produce rate of ${t.name}, ${stale ? "stale, last read" : "now"} ${rate(last?.produce_rate ?? 0)}`} />
                          <span class="num">{rate(last?.produce_rate ?? 0)}</span>
                        </td>
                        <td data-col="ack-rate" class={stale}>
                          <Sparkline values={s.map((x) => x.ack_rate)} label={`ack rate of ${t.name}, ${stale ? "stale, last read" : "now"} ${rate(last?.ack_rate ?? 0)}`} />
                          <span class="num">{rate(last?.ack_rate ?? 0)}</span>
                        </td>
                        <td data-col="backlog-trend" class={stale}>
                          <Sparkline values={s.map((x) => x.backlog)} label={`backlog of ${t.name} over the last minutes${stale ? ", stale" : ""}`} />
                        </td>
                      </>
                    )}
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
      {topics && topics.length > 0 ? (
        <p class="hint">
          Backlog and in flight are current; the oldest unacked age and the lines come from the stats route (the last minutes, one point per{" "}
          {duration(Object.values(stats)[0]?.interval_ms ?? 10000)}, as this node saw them). Refreshed every 5 s.
        </p>
      ) : null}
      <CreateTopic onDone={load} />
    </section>
  );
}

function CreateTopic({ onDone }: { onDone: () => void }) {
  const [name, setName] = useState("");
  const [partitions, setPartitions] = useState("3");
  const [parent, setParent] = useState("");
  const [delay, setDelay] = useState("");
  const [error, setError] = useState<unknown>(null);
  const [note, setNote] = useState("");
  const [dialog, ask] = useConfirm();
  const submit = async (e: Event) => {
    e.preventDefault();
    setError(null);
    setNote("");
    const body: Record<string, unknown> = { name: name.trim() };
    if (partitions.trim()) body.partitions = Number(partitions);
    if (parent.trim()) body.parent = parent.trim();
    if (delay.trim()) body.fanout_delay_ms = Number(delay);
    const what = `Create topic ${body.name} with ${partitions || "the default"} partitions${parent.trim() ? `, as a child of ${parent.trim()}` : ""}?`;
    if (!(await ask(what, "Create"))) return;
    try {
      await api("POST", "/v1/topics", body);
      setNote(`Created topic ${body.name}.`);
      setName("");
      onDone();
    } catch (err) {
      setError(err);
    }
  };
  return (
    <form class="card" onSubmit={submit} aria-labelledby="create-h">
      <h2 id="create-h">Create a topic</h2>
      <div class="fields">
        <label>
          Name
          <input name="name" required value={name} onInput={(e) => setName(e.currentTarget.value)} pattern="[a-zA-Z0-9._\-]+" maxLength={249} />
        </label>
        <label>
          Partitions
          <input name="partitions" type="number" min={1} max={256} value={partitions} onInput={(e) => setPartitions(e.currentTarget.value)} />
        </label>
        <label>
          Parent (optional)
          <input name="parent" value={parent} onInput={(e) => setParent(e.currentTarget.value)} />
        </label>
        <label>
          Fan-out delay, ms (with a parent)
          <input name="delay" type="number" min={0} value={delay} onInput={(e) => setDelay(e.currentTarget.value)} />
        </label>
      </div>
      <button type="submit">Create topic</button>
      <ErrorNote error={error} />
      <Note text={note} />
      {dialog}
    </form>
  );
}

// The settings PATCH /v1/topics/{topic} may change, as the form shows them.
const tunables = [
  { key: "retention_ms", label: "Retention, ms" },
  { key: "visibility_timeout_ms", label: "Visibility timeout, ms" },
  { key: "max_in_flight_per_partition", label: "Max in flight per partition" },
  { key: "max_acked_ahead_per_partition", label: "Max acked ahead per partition" },
] as const;

function schemaText(schema: unknown): string {
  return schema ? JSON.stringify(schema, null, 2) : "";
}

/**
 * Alters a topic's live-tunable settings. Only the fields the user changed are sent
 * (the API keeps the others), and the broker judges the values: the inputs carry no
 * bounds of their own, so a value out of range gets the API's 400 as it came.
 */
function AlterTopic({ t, path, ask, onDone }: { t: TopicDetail; path: string; ask: (text: string, action: string) => Promise<boolean>; onDone: () => void }) {
  const [edits, setEdits] = useState<Record<string, string>>({});
  const [error, setError] = useState<unknown>(null);
  const [note, setNote] = useState("");
  const value = (key: string, current: string) => edits[key] ?? current;
  const submit = async (e: Event) => {
    e.preventDefault();
    setError(null);
    setNote("");
    const body: Record<string, unknown> = {};
    const changes: string[] = [];
    for (const { key } of tunables) {
      const text = edits[key]?.trim();
      if (text === undefined || text === String(t[key])) continue;
      const n = Number(text);
      if (text === "" || !Number.isInteger(n)) {
        setError(new Error(`${key}: write a whole number (got "${text}")`));
        return;
      }
      body[key] = n;
      changes.push(`${key} from ${t[key]} to ${n}`);
    }
    const schema = edits.schema;
    if (schema !== undefined && schema.trim() !== schemaText(t.schema).trim()) {
      if (schema.trim() === "") {
        body.schema = {}; // {} removes the schema
        changes.push("remove the schema");
      } else {
        try {
          body.schema = JSON.parse(schema);
        } catch (err) {
          setError(new Error(`schema: not JSON (${err instanceof Error ? err.message : String(err)})`));
          return;
        }
        changes.push("replace the schema");
      }
    }
    if (changes.length === 0) {
      setNote("Nothing changed.");
      return;
    }
    if (!(await ask(`Alter topic ${t.name}: ${changes.join("; ")}?`, "Alter"))) return;
    try {
      await api("PATCH", path, body);
      setEdits({});
      setNote(`Altered topic ${t.name}.`);
      onDone();
    } catch (err) {
      setError(err);
    }
  };
  return (
    <form class="card" onSubmit={submit} aria-labelledby="alter-h">
      <h2 id="alter-h">Alter settings</h2>
      <div class="fields">
        {tunables.map(({ key, label }) => (
          <label key={key}>
            {label}
            <input name={key} type="number" value={value(key, String(t[key]))} onInput={(e) => setEdits({ ...edits, [key]: e.currentTarget.value })} />
          </label>
        ))}
        <label class="wide">
          Schema (JSON Schema; empty removes it)
          <textarea name="schema" rows={4} value={value("schema", schemaText(t.schema))} onInput={(e) => setEdits({ ...edits, schema: e.currentTarget.value })} />
        </label>
      </div>
      <button type="submit">Alter topic</button>{" "}
      <button type="button" class="secondary" onClick={() => setEdits({})}>
        Reset
      </button>
      <ErrorNote error={error} />
      <Note text={note} />
    </form>
  );
}

export function TopicPage({ name }: { name: string }) {
  const [t, setT] = useState<TopicDetail | null>(null);
  const [children, setChildren] = useState<Child[]>([]);
  const [childrenError, setChildrenError] = useState<unknown>(null);
  const [stats, setStats] = useState<TopicStats | null>(null);
  // A failed stats read keeps the last trends read (statsAt: when; null: none yet),
  // shown as stale beside the error.
  const [statsError, setStatsError] = useState<unknown>(null);
  const [statsAt, setStatsAt] = useState<number | null>(null);
  const [error, setError] = useState<unknown>(null);
  const [actionError, setActionError] = useState<unknown>(null);
  const [note, setNote] = useState("");
  const [child, setChild] = useState("");
  const [delay, setDelay] = useState("");
  const [dialog, ask] = useConfirm();
  const path = `/v1/topics/${enc(name)}`;
  const begin = useInOrder();
  const load = async () => {
    // A refresh answered late is not shown over a newer one: it would put back the
    // topic as it was before (an alter just made undone on the page).
    const current = begin();
    try {
      const got = await api<TopicDetail>("GET", path);
      if (!current()) return;
      setT(got);
      setError(null);
    } catch (e) {
      if (current()) setError(e);
      return;
    }
    try {
      const got = (await api<{ children: Child[] }>("GET", `${path}/children`)).children;
      if (!current()) return;
      setChildren(got);
      setChildrenError(null);
    } catch (e) {
      // Shown in place of the list: "No children" would be a failed read taken for none.
      if (!current()) return;
      setChildrenError(e);
    }
    try {
      const got = await api<TopicStats>("GET", `${path}/stats`);
      if (!current()) return;
      setStats(got);
      setStatsAt(Date.now());
      setStatsError(null);
    } catch (e) {
      // Shown where the trends are: lines gone without a word read as a quiet topic.
      if (current()) setStatsError(e);
    }
  };
  usePoll(load, refreshMs, [name]);
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
  const del = async () => {
    setActionError(null);
    setNote("");
    if (!(await ask(`Delete topic ${name} and every message in it? This cannot be undone.`, "Delete"))) return;
    try {
      // The topic this page shows, not one created again under the name since it was
      // read: another incarnation answers 409 and stays.
      await api("DELETE", t ? `${path}?incarnation=${enc(t.incarnation)}` : path);
      location.hash = "#/topics";
    } catch (e) {
      setActionError(e);
    }
  };
  const s = stats?.samples ?? [];
  return (
    <section aria-labelledby="topic-h">
      <p>
        <a href="#/topics">← Topics</a>
      </p>
      <h1 id="topic-h">Topic {name}</h1>
      <ErrorNote error={error} />
      {t ? (
        <>
          <dl class="settings">
            <dt>Incarnation</dt>
            <dd>{t.incarnation}</dd>
            <dt>Created</dt>
            <dd>{t.created_at}</dd>
            <dt>Retention</dt>
            <dd data-setting="retention">{duration(t.retention_ms)}</dd>
            <dt>Visibility timeout</dt>
            <dd>{duration(t.visibility_timeout_ms)}</dd>
            <dt>Max in flight / acked ahead per partition</dt>
            <dd>
              {t.max_in_flight_per_partition} / {t.max_acked_ahead_per_partition}
            </dd>
            <dt>Replication factor</dt>
            <dd>{t.replication_factor}</dd>
            {t.parent ? (
              <>
                <dt>Parent</dt>
                <dd>
                  <a href={href("topics", t.parent)}>{t.parent}</a> (delay {duration(t.fanout_delay_ms ?? 0)})
                </dd>
              </>
            ) : null}
            <dt>Schema</dt>
            <dd>{t.schema ? <pre>{JSON.stringify(t.schema, null, 2)}</pre> : "none"}</dd>
          </dl>
          {statsError ? <TrendsError error={statsError} at={s.length > 1 ? statsAt : null} /> : null}
          {s.length > 1 ? (
            <div class={statsError ? "trends stale" : "trends"}>
              <Sparkline values={s.map((x) => x.produce_rate)} label="produce rate over the last minutes" /> produce
              <Sparkline values={s.map((x) => x.ack_rate)} label="ack rate over the last minutes" /> ack
              <Sparkline values={s.map((x) => x.backlog)} label="backlog over the last minutes" /> backlog
            </div>
          ) : null}
          <h2>Partitions</h2>
          <div class="scroll">
            <table>
              <thead>
                <tr>
                  <th scope="col">Partition</th>
                  <th scope="col">Oldest offset</th>
                  <th scope="col">Next offset</th>
                  <th scope="col">High watermark</th>
                  <th scope="col">Ack frontier</th>
                  <th scope="col">Acked ahead</th>
                  <th scope="col">In flight</th>
                  <th scope="col">Backlog</th>
                  <th scope="col">Leader</th>
                  <th scope="col">Replicas</th>
                  <th scope="col">Messages</th>
                </tr>
              </thead>
              <tbody>
                {t.partition_stats.map((p) => (
                  <tr key={p.partition}>
                    <th scope="row">{p.partition}</th>
                    {p.available === false ? (
                      // The broker gives an unreachable partition's counters as 0.
                      <td colSpan={7} class="error">
                        unavailable ({unavailableWhy}): figures unknown
                      </td>
                    ) : (
                      <>
                        <td class="num">{p.oldest_offset}</td>
                        <td class="num">{p.next_offset}</td>
                        <td class="num">{p.high_watermark}</td>
                        <td class="num">{p.ack_frontier}</td>
                        <td class="num">{p.acked_ahead}</td>
                        <td class="num">{p.in_flight}</td>
                        <td class="num">{p.backlog}</td>
                      </>
                    )}
                    <td>{p.leader}</td>
                    <td>{p.replicas.join(", ")}</td>
                    <td>
                      <a href={`${href("topics", name, "partitions", p.partition)}?from=${p.oldest_offset}`} aria-label={`Browse messages of partition ${p.partition}`}>
                        Browse
                      </a>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
          <h2>Children</h2>
          {childrenError ? (
            <ErrorNote error={childrenError} />
          ) : children.length === 0 ? (
            <p>No children.</p>
          ) : (
            <div class="scroll">
              <table>
                <thead>
                  <tr>
                    <th scope="col">Child</th>
                    <th scope="col">Delay</th>
                    <th scope="col">State</th>
                    <th scope="col">Lag</th>
                    <th scope="col">Action</th>
                  </tr>
                </thead>
                <tbody>
                  {children.map((c) => (
                    <tr key={c.id ?? c.child}>
                      <th scope="row">
                        {c.remote ? (
                          `${c.child} at ${c.remote.url} (${c.id})`
                        ) : (
                          <a href={href("topics", c.child)}>{c.child}</a>
                        )}
                      </th>
                      <td>{duration(c.fanout_delay_ms)}</td>
                      <td>
                        {c.state ?? "running"}
                        {c.paused_reason ? `: ${c.paused_reason}` : ""}
                      </td>
                      <td class="num">{(c.lag ?? []).reduce((a, l) => a + l.lag, 0)}</td>
                      <td>
                        <button
                          type="button"
                          onClick={() =>
                            act(`Detach ${c.child} from ${name}? Copies stop; both topics stay.`, "Detach", () => api("DELETE", `${path}/children/${enc(c.id ?? c.child)}`), `Detached ${c.child}.`)
                          }
                        >
                          Detach
                        </button>
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )}
          <AlterTopic key={`${t.name}/${t.incarnation}`} t={t} path={path} ask={ask} onDone={load} />
          <form
            class="card"
            aria-labelledby="attach-h"
            onSubmit={(e) => {
              e.preventDefault();
              const body: Record<string, unknown> = { child: child.trim() };
              if (delay.trim()) body.fanout_delay_ms = Number(delay);
              act(`Attach ${child.trim()} as a child of ${name}? Every new message of ${name} is copied to it.`, "Attach", () => api("POST", `${path}/children`, body), `Attached ${child.trim()}.`);
            }}
          >
            <h2 id="attach-h">Attach a child</h2>
            <div class="fields">
              <label>
                Child topic
                <input name="child" required value={child} onInput={(e) => setChild(e.currentTarget.value)} />
              </label>
              <label>
                Fan-out delay, ms
                <input name="child-delay" type="number" min={0} value={delay} onInput={(e) => setDelay(e.currentTarget.value)} />
              </label>
            </div>
            <button type="submit">Attach child</button>
          </form>
          <div class="card danger-zone">
            <h2>Delete</h2>
            <button type="button" class="danger" onClick={del}>
              Delete topic {name}
            </button>
          </div>
        </>
      ) : null}
      <ErrorNote error={actionError} />
      <Note text={note} />
      {dialog}
    </section>
  );
}
