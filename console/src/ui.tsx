// Small shared pieces: errors, the confirmation dialog, sparklines, the hash router.
import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { ApiError } from "./api";

/**
 * Shows an API error as the broker wrote it: its code and its message, after what (what
 * could not be done) when given.
 */
export function ErrorNote({ error, what }: { error: unknown; what?: string }) {
  if (!error) return null;
  const lead = what ? `${what}: ` : null;
  if (error instanceof ApiError) {
    return (
      <p class="error" role="alert">
        {lead}
        <strong>
          {error.status} {error.code}
        </strong>
        : {error.message}
      </p>
    );
  }
  return (
    <p class="error" role="alert">
      {lead}
      {String(error instanceof Error ? error.message : error)}
    </p>
  );
}

export function Note({ text }: { text: string }) {
  if (!text) return null;
  return (
    <p class="ok" role="status">
      {text}
    </p>
  );
}

interface Pending {
  text: string;
  action: string;
  resolve: (ok: boolean) => void;
}

/**
 * A modal confirmation (a <dialog>: focus moves into it, Escape cancels). ask()
 * resolves true only when the user presses the action button.
 */
export function useConfirm(): [ComponentChildren, (text: string, action: string) => Promise<boolean>] {
  const [pending, setPending] = useState<Pending | null>(null);
  const ref = useRef<HTMLDialogElement>(null);
  useEffect(() => {
    const d = ref.current;
    if (pending && d && !d.open) d.showModal();
  }, [pending]);
  const close = (ok: boolean) => {
    ref.current?.close();
    pending?.resolve(ok);
    setPending(null);
  };
  const el = pending ? (
    <dialog ref={ref} aria-labelledby="confirm-text" onCancel={() => close(false)}>
      <p id="confirm-text">{pending.text}</p>
      <div class="actions">
        <button type="button" onClick={() => close(false)}>
          Cancel
        </button>
        <button type="button" class="danger" onClick={() => close(true)}>
          {pending.action}
        </button>
      </div>
    </dialog>
  ) : null;
  const ask = (text: string, action: string) =>
    new Promise<boolean>((resolve) => setPending({ text, action, resolve }));
  return [el, ask];
}

/** A line of values, oldest left, scaled to its own maximum. */
export function Sparkline({ values, label }: { values: number[]; label: string }) {
  const w = 120;
  const h = 28;
  const max = Math.max(0, ...values);
  const step = values.length > 1 ? w / (values.length - 1) : w;
  const pts = values.map((v, i) => `${(i * step).toFixed(1)},${(h - 2 - (max > 0 ? (v / max) * (h - 4) : 0)).toFixed(1)}`);
  return (
    <svg class="spark" width={w} height={h} viewBox={`0 0 ${w} ${h}`} role="img" aria-label={label}>
      <title>{label}</title>
      {values.length > 1 ? <polyline points={pts.join(" ")} /> : null}
    </svg>
  );
}

/**
 * A route segment decoded; one that is not valid percent-encoding (a truncated or
 * hand-edited link) as it is, since decodeURIComponent's URIError would leave the page
 * blank.
 */
function decodeSegment(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** The current hash route without its "?query", split at "/" and decoded. */
export function useRoute(): string[] {
  const parse = () =>
    (location.hash.split("?")[0] ?? "")
      .replace(/^#\/?/, "")
      .split("/")
      .filter((s) => s !== "")
      .map(decodeSegment);
  const [route, setRoute] = useState(parse());
  useEffect(() => {
    const on = () => setRoute(parse());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return route;
}

export function href(...parts: (string | number)[]): string {
  return `#/${parts.map((p) => encodeURIComponent(String(p))).join("/")}`;
}

/**
 * Numbers a page's reads so that only the latest one's answer is shown: begin() starts a
 * read and returns current(), true while no read has begun since and the page is still
 * shown. A read sets what the page shows only while current() holds, so an answer that
 * comes late (a slow refresh, the read of an earlier offset or page) never replaces the
 * answer of a newer read.
 */
export function useLatest(): () => () => boolean {
  const seq = useRef(0);
  useEffect(
    () => () => {
      seq.current++; // the page is gone: no read of it is current
    },
    [],
  );
  return () => {
    const n = ++seq.current;
    return () => seq.current === n;
  };
}

/**
 * Orders the reads of a page that refreshes itself: begin() starts a read and returns
 * current(), false once an answer to a read begun later has been shown (or the page is
 * gone), true otherwise, marking this read's answer shown. So a refresh answered late
 * never replaces a newer answer. Unlike useLatest, a read is not dropped merely because
 * another has begun since: on a node slower than the refresh period every read would be,
 * and the page would show nothing at all.
 */
export function useInOrder(): () => () => boolean {
  const begun = useRef(0);
  const shown = useRef(0);
  const gone = useRef(false);
  useEffect(
    () => () => {
      gone.current = true;
    },
    [],
  );
  return () => {
    const n = ++begun.current;
    return () => {
      if (gone.current || shown.current > n) return false;
      shown.current = n;
      return true;
    };
  };
}

/** Runs load now and every ms while mounted (and again when deps change). */
export function usePoll(load: () => void, ms: number, deps: unknown[]): void {
  useEffect(() => {
    load();
    const id = setInterval(load, ms);
    return () => clearInterval(id);
  }, deps);
}
