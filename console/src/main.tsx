// narad console: a client of the broker's public HTTP API, served by the broker at
// /console. See ../README.md.
import { type ComponentChildren, render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ClusterPage, UsersPage } from "./admin";
import { ApiError, api, basicLogin, login, onUnauthenticated, setLogin } from "./api";
import { MessagesPage } from "./messages";
import { TopicPage, TopicsPage } from "./topics";
import { ErrorNote, useRoute } from "./ui";

type State = { kind: "checking" } | { kind: "login"; error?: unknown } | { kind: "in"; security: boolean };

/** Asks the API whether the saved credentials (or none) are accepted. */
async function probe(): Promise<State> {
  const tried = login() !== null;
  try {
    await api("GET", "/v1/topics");
    return { kind: "in", security: login() !== null };
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      // Credentials refused: say so; none given (the first visit): just ask for them.
      return tried ? { kind: "login", error: e } : { kind: "login" };
    }
    return { kind: "login", error: e };
  }
}

function LoginForm({ error, onDone }: { error?: unknown; onDone: (s: State) => void }) {
  const [user, setUser] = useState("");
  const [password, setPassword] = useState("");
  const [busy, setBusy] = useState(false);
  return (
    <main class="login">
      <h1>narad console</h1>
      <form
        class="card"
        aria-labelledby="login-h"
        onSubmit={async (e) => {
          e.preventDefault();
          setBusy(true);
          setLogin(basicLogin(user, password));
          const s = await probe();
          if (s.kind !== "in") setLogin(null);
          setBusy(false);
          onDone(s);
        }}
      >
        <h2 id="login-h">Log in</h2>
        <label>
          Username
          <input name="username" autocomplete="username" required value={user} onInput={(e) => setUser(e.currentTarget.value)} />
        </label>
        <label>
          Password
          <input name="password" type="password" autocomplete="current-password" required value={password} onInput={(e) => setPassword(e.currentTarget.value)} />
        </label>
        <button type="submit" disabled={busy}>
          Log in
        </button>
        <ErrorNote error={error} />
      </form>
    </main>
  );
}

function App() {
  const [state, setState] = useState<State>({ kind: "checking" });
  const route = useRoute();
  useEffect(() => {
    probe().then(setState);
    // A 401 anywhere (api() has forgotten the credentials): ask for others, saying why.
    onUnauthenticated((e) => setState((s) => (s.kind === "in" ? { kind: "login", error: e } : s)));
    return () => onUnauthenticated(null);
  }, []);
  if (state.kind === "checking") return <p>Loading…</p>;
  if (state.kind === "login") return <LoginForm error={state.error} onDone={setState} />;
  const [page, a, b, c] = route;
  let body: ComponentChildren;
  if (page === "topics" && a && b === "partitions" && c !== undefined) body = <MessagesPage topic={a} partition={c} key={`${a}/${c}`} />;
  else if (page === "topics" && a) body = <TopicPage name={a} key={a} />;
  else if (page === "cluster") body = <ClusterPage />;
  else if (page === "users") body = <UsersPage />;
  else body = <TopicsPage />;
  const nav = (name: string, label: string) => (
    <a href={`#/${name}`} aria-current={(page ?? "topics") === name ? "page" : undefined}>
      {label}
    </a>
  );
  const me = login();
  return (
    <>
      <button
        type="button"
        class="skip"
        onClick={() => {
          // The hash is the route: move the focus instead of navigating.
          document.getElementById("main")?.focus();
        }}
      >
        Skip to content
      </button>
      <header>
        <span class="brand">narad</span>
        <nav aria-label="Sections">
          {nav("topics", "Topics")}
          {nav("cluster", "Cluster")}
          {nav("users", "Users")}
        </nav>
        <span class="who">
          {me ? (
            <>
              <span>{me.user}</span>
              <button
                type="button"
                onClick={() => {
                  setLogin(null);
                  setState({ kind: "login" });
                }}
              >
                Log out
              </button>
            </>
          ) : (
            <span class="tag">security off</span>
          )}
        </span>
      </header>
      <main id="main" tabIndex={-1}>
        {body}
      </main>
    </>
  );
}

render(<App />, document.getElementById("app")!);
