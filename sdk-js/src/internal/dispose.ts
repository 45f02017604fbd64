// Symbol.asyncDispose exists from Node 20.4 (and in Deno, Bun and current browsers);
// define it on older runtimes so `[Symbol.asyncDispose]` methods and `await using`
// work everywhere the package claims to run. Imported for its side effect only.
const s = Symbol as { asyncDispose?: symbol };
s.asyncDispose ??= Symbol.for("Symbol.asyncDispose");
export {};
