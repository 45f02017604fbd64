// Replay of one partition from an offset or a time: GET .../messages, which takes no
// lease, so looking never changes what consumers get.
import { useEffect, useState } from "preact/hooks";
import { api, enc, type Message, type MessageRange } from "./api";
import { renderPayload, type View } from "./format";
import { ErrorNote, href, useLatest } from "./ui";

const views: View[] = ["json", "text", "base64", "hex"];

export function MessagesPage({ topic, partition }: { topic: string; partition: string }) {
  const params = new URLSearchParams(location.hash.split("?")[1] ?? "");
  const [from, setFrom] = useState(params.get("from") ?? "");
  const [fromTime, setFromTime] = useState("");
  const [max, setMax] = useState("20");
  const [view, setView] = useState<View>("json");
  const [msgs, setMsgs] = useState<Message[] | null>(null);
  const [next, setNext] = useState<number | null>(null);
  const [damaged, setDamaged] = useState<number[]>([]);
  // The topic incarnation the messages shown come from: the next page asks for it, so
  // a topic deleted and created again since answers 409, not its own messages.
  const [incarnation, setIncarnation] = useState<string | undefined>(undefined);
  const [error, setError] = useState<unknown>(null);
  const begin = useLatest();
  const read = async (start: { from?: string; fromTime?: string; incarnation?: string }) => {
    const q = new URLSearchParams({ max: max || "20", payload_encoding: "base64" });
    if (start.fromTime) q.set("from_time", start.fromTime);
    else if (start.from) q.set("from", start.from);
    if (start.incarnation) q.set("incarnation", start.incarnation);
    // Only the latest read is shown: the answer to an earlier one (another offset, the
    // page before) that comes after it would show messages the controls do not name.
    const current = begin();
    try {
      const r = await api<MessageRange>("GET", `/v1/topics/${enc(topic)}/partitions/${enc(partition)}/messages?${q}`);
      if (!current()) return;
      setMsgs(r.messages);
      setNext(r.next_offset);
      setDamaged(r.damaged ?? []);
      setIncarnation(r.incarnation);
      setError(null);
    } catch (e) {
      if (current()) setError(e);
    }
  };
  useEffect(() => {
    read({ from });
  }, [topic, partition]);
  return (
    <section aria-labelledby="msgs-h">
      <p>
        <a href={href("topics", topic)}>← Topic {topic}</a>
      </p>
      <h1 id="msgs-h">
        {topic}, partition {partition}
      </h1>
      <p>Reading takes no lease: consumers are not affected.</p>
      <form
        class="card"
        onSubmit={(e) => {
          e.preventDefault();
          read({ from, fromTime });
        }}
      >
        <div class="fields">
          <label>
            From offset
            <input name="from" type="number" min={0} value={from} onInput={(e) => setFrom(e.currentTarget.value)} />
          </label>
          <label>
            Or from time (RFC 3339 or Unix ms)
            <input name="from-time" value={fromTime} onInput={(e) => setFromTime(e.currentTarget.value)} placeholder="2026-01-31T12:00:00Z" />
          </label>
          <label>
            At most
            <input name="max" type="number" min={1} max={1000} value={max} onInput={(e) => setMax(e.currentTarget.value)} />
          </label>
        </div>
        <button type="submit">Read</button>
      </form>
      <fieldset class="views">
        <legend>Show payloads as</legend>
        {views.map((v) => (
          <label key={v}>
            <input type="radio" name="view" value={v} checked={view === v} onChange={() => setView(v)} />
            {v === "json" ? "JSON" : v}
          </label>
        ))}
      </fieldset>
      <ErrorNote error={error} />
      {damaged.length > 0 ? (
        <p class="error" role="alert">
          {damaged.length === 1
            ? `Offset ${damaged[0]} is damaged: its stored record fails its checksum, so the broker skipped it and it cannot be shown`
            : `Offsets ${damaged.join(", ")} are damaged: their stored records fail their checksums, so the broker skipped them and they cannot be shown`}{" "}
          (counted in narad_damaged_records_total).
        </p>
      ) : null}
      {msgs === null ? null : msgs.length === 0 ? (
        <p>No messages from there.</p>
      ) : (
        <ol class="messages" aria-label="Messages">
          {msgs.map((m) => (
            <li key={m.offset} data-offset={m.offset}>
              <div class="meta">
                offset <strong>{m.offset}</strong> · {new Date(m.timestamp).toISOString()}
                {m.key != null ? ` · key ${m.key}` : ""}
              </div>
              <pre>{renderPayload(String(m.payload), view)}</pre>
            </li>
          ))}
        </ol>
      )}
      {next !== null && msgs && msgs.length > 0 ? (
        <button
          type="button"
          onClick={() => {
            setFrom(String(next));
            setFromTime("");
            read({ from: String(next), incarnation });
          }}
        >
          Next page (from {next})
        </button>
      ) : null}
    </section>
  );
}
