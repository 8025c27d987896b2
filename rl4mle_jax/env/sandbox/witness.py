"""The witness: milestone evidence observed from outside the program's own code.

The launcher starts the program as `python -c BOOTSTRAP <key fd> <evidence fd> main.py` instead
of `python main.py`. Before the program's first line the bootstrap installs

  * a PEP 578 audit hook (all threads): imports, opens, and refusals of escape hatches;
  * a profile hook (the main thread, switched off while an import runs, which keeps the cost
    near plain Python): calls of *library* code (co_filename in site-packages) that fit, train,
    construct or predict with an estimator.

Each milestone is written once to the evidence pipe as `seq pid kind detail mac`, the mac an
HMAC-SHA256 under a key the launcher (a separate, non-dumpable process) hands over through a
pipe that is read once and closed. Only the hooks' closures hold the hmac object; the launcher
verifies every line (`READER`) and puts the summary in its status line (`validate_evidence`).

Not witnessed: pythons started as subprocesses (no hooks, and they do not inherit the evidence
fd), fits that run in threads other than the main one (the top-level fit almost always runs in
the main thread; the audit hook still sees imports and opens of every thread), and library code
run while an import is in progress. All of these only lose evidence, they never create it.

In a program forked from a pre-imported interpreter (zygote.py sets `_preloaded`), importing a
module already in sys.modules raises no "import" event, so `__import__` is wrapped to name the
program's own imports of them; `importlib.import_module` of a preloaded module goes unseen.
"""

from __future__ import annotations

from typing import Any

LIST_KEYS = ("milestones", "libraries", "fits", "input_reads", "refused")
LIST_CAP = 12  # entries per list
ITEM_CAP = 96  # characters per entry
KIND_OF = {"l": "libraries", "f": "fits", "i": "input_reads", "r": "refused"}

# Runs as the -c program of the child; `_w` installs everything and deletes itself, so the
# program's frames lead back only to this module frame, whose globals are the program's own.
_DEFS = r'''
def _w():
    import sys, os, _thread, builtins
    g = sys.modules["__main__"].__dict__
    del g["_w"]
    preloaded = g.pop("_preloaded", False)  # set by zygote.py, before this runs
    argv = sys.argv
    kfd, efd = int(argv[1]), int(argv[2])
    del argv[:3]
    path = os.path.join(os.getcwd(), argv[0])
    sys.path[0] = os.path.dirname(path)
    with open(path, "rb") as f:
        src = f.read()
    try:
        _install(sys, os, _thread, builtins, kfd, efd, path, preloaded)
    except BaseException as e:
        try:
            msg = ("%s: %s" % (type(e).__name__, e)).encode("ascii", "replace")[:200]
            os.write(efd, b"error " + msg.replace(b"\n", b" ") + b"\n")
            os.close(efd)
        except BaseException:
            pass
    try:
        os.close(kfd)
    except OSError:
        pass
    import _frozen_importlib_external as fie
    g.clear()
    g.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None,
             __loader__=fie.SourceFileLoader("__main__", path), __annotations__={},
             __builtins__=builtins, __file__=path, __cached__=None)
    return src, path, "exec"


def _install(sys, os, _thread, builtins, kfd, efd, main_path, preloaded):
    import hmac, posix
    import importlib._bootstrap as ib
    import importlib._bootstrap_external as ibe
    from types import CodeType, FunctionType, ModuleType
    key = os.read(kfd, 64)
    os.close(kfd)
    if len(key) < 32:
        raise RuntimeError("no witness key")
    mac = hmac.new(key, digestmod="sha256")
    del key
    os.set_inheritable(efd, False)
    os.set_blocking(efd, False)
    lstat, readlink, getpid, write, getcwd = (posix.lstat, posix.readlink, posix.getpid,
                                              posix.write, posix.getcwd)
    _getframe, setprofile, audit = sys._getframe, sys.setprofile, sys.audit
    modules, stdlib = sys.modules, sys.stdlib_module_names
    main_ident = _thread.get_ident()
    S_IFMT, S_IFLNK, S_IFDIR = 0o170000, 0o120000, 0o040000
    tdict = type.__dict__["__dict__"].__get__
    tmro = type.__dict__["__mro__"].__get__
    fcode = FunctionType.__dict__["__code__"].__get__
    mdict = ModuleType.__dict__["__dict__"].__get__
    cwd = getcwd()
    pfx = []
    for p in sys.path:
        if type(p) is str and p.endswith(("/site-packages", "/dist-packages")):
            for q in (p, os.path.realpath(p)):
                if q + "/" not in pfx:
                    pfx.append(q + "/")
    if not pfx:
        raise RuntimeError("no site-packages on sys.path")
    libs = tuple(pfx)
    input_dir = cwd + "/input"
    try:
        st = lstat(input_dir)
        input_id = (st.st_dev, st.st_ino)
    except OSError:
        input_id = None
    readonly = libs + tuple(q + "/" for q in {sys.base_prefix, sys.prefix} if q != "/") + (
        "/usr/",)
    writable = (cwd + "/", "/tmp/", "/dev/shm/", "/var/tmp/")
    # ctypes foreign calls raise no audit event in 3.11; dlsym does, so refuse the symbols
    # that read or unprotect memory (ctypes.memmove/cast need no dlsym: see the README)
    bad_sym = frozenset(("prctl", "ptrace", "process_vm_readv", "process_vm_writev", "syscall",
                         "memcpy", "memmove", "mprotect", "PyEval_SetProfile", "PyEval_SetTrace",
                         "PyGC_Collect", "_PyObject_GC_New", "PyObject_GC_Track"))
    marshal_ok = (ibe._compile_bytecode.__code__,)
    state = {"seq": 0, "depth": 0, "own": False, "buf": None}
    seen = set()
    counts = {}
    cls_cache = {}
    lib_cache = {}

    def emit(kind, detail):
        # detail: a short ASCII token (no spaces); once per (kind, detail), capped per kind
        k = (kind, detail)
        if k in seen:
            return
        n = counts.get(kind, 0)
        if n >= 12:
            return
        seen.add(k)
        counts[kind] = n + 1
        state["seq"] += 1
        body = ("%d %d %s %s" % (state["seq"], getpid(), kind, detail)).encode("ascii",
                                                                               "replace")
        m = mac.copy()
        m.update(body)
        try:
            write(efd, body + b" " + m.hexdigest().encode() + b"\n")
        except OSError:
            pass

    def milestone(name):
        if name == "model_trained" or name == "predictions_made":
            emit("m", "model_defined")
        emit("m", name)

    def refuse(what):
        emit("r", what.replace(" ", "_")[:90])
        raise PermissionError("rl4mle witness: %s refused" % what)

    def split(p):
        return [c for c in p.split("/") if c and c != "."]

    def resolve(p, base):
        # realpath with captured C calls only (the program may patch os.path)
        parts = split(p) if p.startswith("/") else split(base) + split(p)
        out, hops = [], 0
        while parts:
            c = parts.pop(0)
            if c == "..":
                if out:
                    out.pop()
                continue
            cand = "/" + "/".join(out + [c])
            try:
                st = lstat(cand)
            except OSError:
                out.append(c)
                continue
            if st.st_mode & S_IFMT == S_IFLNK and hops < 40:
                hops += 1
                t = readlink(cand)
                if t.startswith("/"):
                    out = []
                parts = split(t) + parts
            else:
                out.append(c)
        return "/" + "/".join(out)

    # /proc/<pid>/maps stays readable: threadpoolctl (scikit-learn's thread limits) and torch
    # list loaded libraries from it; it shows the address layout, not memory contents.
    PROC_BAD = frozenset(("mem", "smaps", "smaps_rollup", "numa_maps", "pagemap",
                          "map_files", "environ", "fd", "fdinfo", "syscall", "auxv", "stack"))

    def proc_bad(p):
        c = split(p)
        if not c:
            return False
        if c[0] == "dev" and len(c) > 1 and c[1] == "fd":
            return True
        if c[0] != "proc":
            return False
        if len(c) == 1:
            return True  # /proc itself: a base for dir_fd-relative opens
        if c[1].isdigit() or c[1] in ("self", "thread-self"):
            rest = c[2:]
            if rest[:1] == ["task"]:
                rest = rest[2:]
            return not rest or rest[0] in PROC_BAD or rest[0] in ("root", "cwd")
        return False

    def check_path(ev, p, relative_unknown):
        if type(p) is bytes:
            p = p.decode("utf-8", "surrogateescape")
        if type(p) is not str:
            return None
        if relative_unknown and not p.startswith("/"):
            # os.open with a dir_fd we cannot see: judge by the names alone
            if any(c in PROC_BAD for c in split(p)):
                refuse("%s of %s" % (ev, p[-60:]))
        if p.startswith(readonly) and "/.." not in p:
            return p  # read-only mounts hold no program-made links
        r = resolve(p, cwd)
        if proc_bad(p if p.startswith("/") else cwd + "/" + p) or proc_bad(r):
            if r.rsplit("/", 1)[-1] not in ("0", "1", "2") or "/fd/" not in r:
                refuse("%s of %s" % (ev, p[-60:]))
        return r

    def under_input(r):
        if input_id is None:
            return False
        parts = split(r)
        for i in range(len(parts), 0, -1):
            try:
                st = lstat("/" + "/".join(parts[:i]))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == input_id:
                return i < len(parts)
        return False

    def is_lib_file(fn):
        return type(fn) is str and fn.startswith(libs)

    def lib_rel(fn):
        for p in libs:
            if fn.startswith(p):
                return fn[len(p):]
        return fn

    def installed(top):
        v = lib_cache.get(top)
        if v is None:
            v = False
            local = False
            for n in (top, top + ".py"):
                try:
                    lstat(main_path.rsplit("/", 1)[0] + "/" + n)
                    local = True
                except OSError:
                    pass
            if not local:
                for p in libs:
                    try:
                        names = posix.listdir(p)
                    except OSError:
                        continue
                    for n in names:
                        if n == top or n.startswith(top + ".") and (
                                n.endswith(".py") or ".cpython" in n or n.endswith(".so")):
                            v = True
                            break
                    if v:
                        break
            lib_cache[top] = v
        return v

    def on_import(name):
        if type(name) is not str or name.startswith("."):
            return
        top = name.partition(".")[0]
        if top in stdlib or top.startswith("_") or ("l", top) in seen:
            return
        if installed(top):
            emit("l", top[:40])
            milestone("libraries_imported")

    def on_open(ev, a):
        p = a[0]
        if type(p) is int:
            return
        os_open = ev == "open" and len(a) > 1 and a[1] is None
        r = check_path(ev, p, os_open)
        if r is None or ev != "open":
            return
        flags = a[2] if len(a) > 2 and type(a[2]) is int else 0
        mode = a[1] if len(a) > 1 and type(a[1]) is str else ""
        writing = flags & 3 != 0 or any(c in mode for c in "wax+")
        if writing:
            if r == cwd + "/submission/submission.csv":
                milestone("submission_written")
        elif under_input(r):
            rel = r.rsplit("/", 1)[-1]
            emit("i", rel[:90].replace(" ", "_"))
            milestone("data_loaded")

    def claims(fn):
        # code under these names is trusted by the hooks below
        return type(fn) is str and (fn.startswith(libs) or fn.startswith("<frozen"))

    def from_importlib():
        f = _getframe(2)  # 0: this, 1: hook, 2: the caller of compile/exec/code.replace
        fn = f.f_code.co_filename if f is not None else None
        return type(fn) is str and fn.startswith("<frozen importlib")

    def hook(ev, a):
        try:
            if ev not in WATCH:
                return
            if ev == "open" or ev == "os.listdir" or ev == "os.scandir":
                on_open(ev, a)
            elif ev == "import":
                on_import(a[0])
            elif ev == "rl4mle.witness.import":
                if _thread.get_ident() != main_ident:
                    return
                d = state["depth"] + (1 if a[0] else -1)
                state["depth"] = max(d, 0)
                if (a[0] and d == 1) or (not a[0] and d == 0):
                    state["own"] = True
                    try:
                        setprofile(None if a[0] else prof)
                    finally:
                        state["own"] = False
            elif ev == "sys.setprofile" or ev == "sys.settrace":
                if not state["own"]:
                    refuse(ev)
            elif ev == "compile" or ev == "code.__new__":
                fn = a[1]
                if type(fn) is bytes:
                    fn = fn.decode("utf-8", "replace")
                if type(fn) is str and claims(fn) and not from_importlib():
                    refuse("%s as %s" % (ev, fn.rsplit("/", 1)[-1][:40]))
            elif ev == "exec":
                co = a[0]
                if type(co) is CodeType and claims(co.co_filename) and not from_importlib():
                    refuse("exec of library-named code")
            elif ev == "marshal.loads" or ev == "marshal.load":
                f = _getframe(1)
                if f is None or f.f_code not in marshal_ok:
                    refuse(ev)
            elif ev == "ctypes.dlsym":
                if type(a[1]) is str and a[1] in bad_sym:
                    refuse("ctypes.dlsym " + a[1])
            elif ev == "ctypes.cdata/buffer":
                state["buf"] = a[0] + a[2] if type(a[0]) is int and type(a[2]) is int else None
            elif ev == "ctypes.cdata":
                b, state["buf"] = state["buf"], None
                if b is None or a[0] != b:
                    refuse(ev)
            elif ev == "ctypes.dlopen":
                p = a[0]
                if type(p) is str and "/" in p and resolve(p, cwd).startswith(writable):
                    refuse("dlopen of a run-dir library")
            else:  # gc.*, ctypes.string_at, sys._current_frames
                refuse(ev)
        except PermissionError:
            raise
        except BaseException:
            return

    WATCH = frozenset((
        "open", "os.listdir", "os.scandir", "import", "rl4mle.witness.import",
        "sys.setprofile", "sys.settrace", "compile", "exec", "marshal.loads", "marshal.load",
        "ctypes.dlsym", "ctypes.cdata/buffer", "ctypes.cdata", "ctypes.dlopen",
        "gc.get_objects", "gc.get_referrers", "gc.get_referents", "ctypes.string_at",
        "ctypes.wstring_at", "code.__new__", "sys._current_frames"))

    FIT = frozenset(("fit", "partial_fit", "fit_predict"))
    PRED = frozenset(("predict", "predict_proba", "predict_log_proba", "decision_function",
                      "inplace_predict"))
    PRED_LIKE = PRED | frozenset(("forward", "fit_predict"))
    TRAIN = {"lstsq": "numpy/linalg/", "polyfit": "numpy/", "minimize": "scipy/optimize/",
             "curve_fit": "scipy/optimize/", "least_squares": "scipy/optimize/",
             "train": ("lightgbm/", "xgboost/", "catboost/"), "step": "torch/optim/"}
    NAMES = FIT | PRED | frozenset(TRAIN) | frozenset(("__init__", "forward"))

    def genuine(frame, co):
        # the frame's globals must be the live module of that file (not FunctionType(code, g))
        gl = frame.f_globals
        rel = lib_rel(co.co_filename)
        mod = rel[:-3] if rel.endswith(".py") else rel
        mod = mod[:-9] if mod.endswith("/__init__") else mod
        m = modules.get(mod.replace("/", "."))
        return type(m) is ModuleType and mdict(m) is gl

    def estimator(cls):
        # (is an estimator, is a torch module): a library class in the MRO with a library
        # predict-like method; never calls program code (no getattr, no ==, no isinstance)
        v = cls_cache.get(id(cls))
        if v is not None and v[0] is cls:
            return v[1]
        est = torch = False
        for c in tmro(cls):
            d = tdict(c)
            lib_cls = False
            pred = None
            for k, val in d.items():
                if type(k) is not str:
                    continue
                if type(val) is FunctionType:
                    co = fcode(val)
                    if is_lib_file(co.co_filename):
                        lib_cls = True
                        if k in PRED_LIKE and (co.co_name == k or
                                               co.co_name == "_forward_unimplemented"):
                            pred = k
                        if k == "forward" and lib_rel(co.co_filename).startswith("torch/"):
                            torch = True
                elif k in PRED_LIKE and pred is None:
                    pred = ""  # a descriptor (sklearn's available_if) of a library class
            if lib_cls and pred is not None:
                est = True
        if len(cls_cache) < 512:
            cls_cache[id(cls)] = (cls, (est, torch))
        return est, torch

    def first_arg(frame, co):
        if co.co_argcount < 1:
            return None
        loc = frame.f_locals
        if type(loc) is not dict:
            return None
        return loc.get(co.co_varnames[0])

    def fit_name(co):
        q = co.co_qualname
        rel = lib_rel(co.co_filename)
        return (rel.partition("/")[0] + "." + q)[:90] if type(q) is str else "?"

    def prof(frame, event, arg):
        try:
            if event != "call" and event != "return":
                return
            co = frame.f_code
            name = co.co_name
            if name not in NAMES or not co.co_filename.startswith(libs):
                return
            rel = lib_rel(co.co_filename)
            t = TRAIN.get(name)
            if t is not None:
                if event == "call" and rel.startswith(t) and "lr_scheduler" not in rel \
                        and "swa_utils" not in rel and genuine(frame, co):
                    emit("f", fit_name(co))
                    milestone("model_trained")
                return
            if event == "call" and name != "__init__" or event == "return" and arg is None:
                return
            if name == "__init__" and ("m", "model_defined") in seen:
                return
            obj = first_arg(frame, co)
            if obj is None or not genuine(frame, co):
                return
            est, torch = estimator(type(obj))
            if not est:
                return
            if name == "__init__":
                milestone("model_defined")
            elif name in FIT:
                emit("f", fit_name(co))
                milestone("model_trained")
                if name == "fit_predict":
                    milestone("predictions_made")
            elif name == "forward" and torch or name in PRED:
                milestone("model_defined")
                milestone("predictions_made")
        except BaseException:
            return

    orig_fal = ib._find_and_load

    def _find_and_load(name, import_):
        audit("rl4mle.witness.import", 1)
        try:
            return orig_fal(name, import_)
        finally:
            audit("rl4mle.witness.import", 0)

    if preloaded:
        # A pre-imported interpreter (zygote.py) finds the libraries in sys.modules, where
        # importing raises no "import" event: name the program's own imports of them here.
        orig_import = builtins.__import__

        def __import__(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and type(name) is str and name in modules:
                on_import(name)
            return orig_import(name, globals, locals, fromlist, level)

        builtins.__import__ = __import__

    sys.addaudithook(hook)
    ib._find_and_load = _find_and_load
    state["own"] = True
    setprofile(prof)
    state["own"] = False
    sys.getprofile = lambda: None
    emit("s", "start")
'''

# Named like importlib so that import tracebacks drop the wrapper's frames as they drop
# importlib's own; the program cannot compile code under that name (refused above).
BOOTSTRAP = f"exec(compile({_DEFS!r}, '<frozen importlib._bootstrap>', 'exec'))\n" + r'''
try:
    exec(compile(*_w()), globals())
except SystemExit:
    raise
except BaseException:
    _t, _v, _tb = __import__("sys").exc_info()
    _tb = _tb.tb_next if _tb is not None else None  # drop this frame, as python main.py would
    __import__("sys").excepthook(_t, _v.with_traceback(_tb), _tb)
    raise SystemExit(1)
'''

# Runs inside the launcher: parses and verifies what the bootstrap wrote.
READER = r'''
def read_evidence(fd, key, limit=65536):
    import hmac, os
    data = b""
    try:
        os.set_blocking(fd, False)
        while len(data) < limit:
            chunk = os.read(fd, limit - len(data))
            if not chunk:
                break
            data += chunk
    except (BlockingIOError, OSError):
        pass
    ev = {"witness": 1, "verified": True, "forged_lines": 0, "milestones": [], "libraries": [],
          "fits": [], "input_reads": [], "refused": [], "error": None}
    kinds = {"l": "libraries", "f": "fits", "i": "input_reads", "r": "refused"}
    last, started = {}, False
    for line in data.split(b"\n")[:2048]:
        if not line:
            continue
        parts = line[:512].split(b" ")
        if parts[0] == b"error" and not started and ev["error"] is None:
            ev["error"] = line[6:206].decode("ascii", "replace")
            continue
        ok = len(parts) == 5 and parts[0].isdigit() and parts[1].isdigit()
        if ok:
            m = hmac.new(key, b" ".join(parts[:4]), "sha256").hexdigest().encode()
            seq, pid = int(parts[0]), int(parts[1])
            ok = hmac.compare_digest(m, parts[4]) and seq > last.get(pid, 0)
        if not ok:
            ev["forged_lines"] += 1
            ev["verified"] = False
            continue
        last[pid] = seq
        kind, detail = parts[2].decode("ascii", "replace"), parts[3].decode("ascii", "replace")
        if kind == "s":
            started = True
        elif kind == "m":
            lst = ev["milestones"]
            if detail not in lst and len(lst) < 12:
                lst.append(detail)
        elif kind in kinds:
            lst = ev[kinds[kind]]
            if detail not in lst and len(lst) < 12:
                lst.append(detail[:96])
    if not started and ev["error"] is None:
        ev["error"] = "witness did not start"
    return ev
'''


def validate_evidence(obj: Any) -> dict[str, Any] | None:
    """The launcher's evidence dict, checked and capped; None when malformed."""
    if not isinstance(obj, dict):
        return None
    try:
        out: dict[str, Any] = {"witness": int(obj["witness"]),
                               "verified": bool(obj["verified"]) and obj["verified"] is True,
                               "forged_lines": int(obj["forged_lines"])}
        for k in LIST_KEYS:
            v = obj[k]
            if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
                return None
            out[k] = [s[:ITEM_CAP] for s in v[:LIST_CAP]]
        err = obj["error"]
        if err is not None and not isinstance(err, str):
            return None
        out["error"] = err[:200] if err is not None else None
        return out
    except (KeyError, TypeError, ValueError):
        return None
