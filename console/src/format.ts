// Pure helpers: payload views, grants text, durations. No DOM.

export type View = "json" | "text" | "base64" | "hex";

export function base64ToBytes(b64: string): Uint8Array {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** The text of bytes if they are valid UTF-8, else null. */
export function utf8(bytes: Uint8Array): string | null {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return null;
  }
}

/** A hex dump: offset, 16 bytes in hex, and their printable ASCII. */
export function hexDump(bytes: Uint8Array): string {
  const lines: string[] = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const row = bytes.subarray(i, i + 16);
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${i.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  return lines.join("\n");
}

/**
 * The characters JSON.stringify(v, null, 2) adds to v's compact form, or -1 once they
 * pass budget. Every member of an array or object goes on a line of its own, indented
 * two spaces per level, so the indented form grows with the nesting: 200 KiB of arrays
 * nested 128 deep (the broker's limit) would indent to 26 MiB, and a page of such
 * messages to more than a tab can hold.
 */
function indentCost(v: unknown, depth: number, budget: number): number {
  if (v === null || typeof v !== "object") return 0;
  const items = Array.isArray(v) ? v : Object.values(v);
  if (items.length === 0) return 0;
  // Each member: a newline and its indentation (and in an object the space after the
  // colon); then the closing bracket's line.
  let cost = items.length * (1 + 2 * (depth + 1) + (Array.isArray(v) ? 0 : 1)) + 1 + 2 * depth;
  for (const item of items) {
    if (cost > budget) return -1;
    const c = indentCost(item, depth + 1, budget - cost);
    if (c < 0) return -1;
    cost += c;
  }
  return cost > budget ? -1 : cost;
}

/** Renders a payload fetched with payload_encoding=base64 in one of the views. */
export function renderPayload(b64: string, view: View): string {
  const bytes = base64ToBytes(b64);
  switch (view) {
    case "base64":
      return b64;
    case "hex":
      return hexDump(bytes);
    case "text":
      return utf8(bytes) ?? "(not UTF-8 text: choose base64 or hex)";
    case "json": {
      const t = utf8(bytes);
      if (t === null) return "(not UTF-8 text: choose base64 or hex)";
      let v: unknown;
      try {
        v = JSON.parse(t);
      } catch {
        return `(not JSON) ${t}`;
      }
      try {
        // Indented when that makes it at most four times as long, plus 64 KiB.
        if (indentCost(v, 0, 3 * t.length + 65536) >= 0) return JSON.stringify(v, null, 2);
      } catch {
        // nested past the stack (the broker refuses such payloads): as sent, below
      }
      return `(JSON shown as sent: indented, its nesting would make it many times as long) ${t}`;
    }
  }
}

/** Parses "produce: orders.*, billing; consume: orders.*" into grants. */
export function parseGrants(text: string): { action: string; topics: string[] }[] {
  const out: { action: string; topics: string[] }[] = [];
  for (const part of text.split(/[;\n]/)) {
    const p = part.trim();
    if (!p) continue;
    const i = p.indexOf(":");
    if (i < 0) throw new Error(`"${p}": write action: topic, topic (e.g. consume: orders.*)`);
    const action = p.slice(0, i).trim();
    const topics = p
      .slice(i + 1)
      .split(",")
      .map((t) => t.trim())
      .filter((t) => t !== "");
    out.push({ action, topics });
  }
  return out;
}

export function grantsText(grants: { action: string; topics: string[] }[]): string {
  return grants.map((g) => `${g.action}: ${g.topics.join(", ")}`).join("; ");
}

export function duration(ms: number): string {
  if (ms <= 0) return "0";
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 120) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  const m = s / 60;
  if (m < 120) return `${m.toFixed(0)} min`;
  const h = m / 60;
  if (h < 48) return `${h.toFixed(0)} h`;
  return `${(h / 24).toFixed(0)} d`;
}

export function rate(perSec: number): string {
  if (perSec === 0) return "0/s";
  if (perSec < 10) return `${perSec.toFixed(1)}/s`;
  return `${Math.round(perSec)}/s`;
}

/** Bytes in binary units: "37.2 GiB". */
export function bytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

/** A duration in ms with the precision a sync round needs: "0.42 ms", "3.1 ms", "120 ms". */
export function millis(ms: number): string {
  if (ms === 0) return "0 ms";
  if (ms < 1) return `${ms.toFixed(2)} ms`;
  if (ms < 10) return `${ms.toFixed(1)} ms`;
  return `${Math.round(ms)} ms`;
}
