"""The FTI Fabric Manager API (docs/fti-fabric-api.md) over the host's imports."""

import base64
import json
import time
from typing import List, Optional, Tuple
from urllib.parse import quote, urlencode

from componentize_py_types import Err
from wit_world.imports import config, http, log, lookup, secrets, state, types
from wit_world.imports.types import (
    DeviceInfo,
    DeviceType,
    FabricError,
    ProviderError_Config,
    ProviderError_Critical,
    ProviderError_Denied,
    ProviderError_Fabric,
    ProviderError_MalformedReply,
    ProviderError_NoCapacity,
    ProviderError_NotFound,
    ProviderError_Other,
    ProviderError_Unavailable,
    ProviderError_Warning,
)

TOKEN_KEY = "python-fti/token"
# attempt key -> the device an attach of that attempt got (see Fabric.attach_once).
ATTEMPT_PREFIX = "python-fti/attempt/"
ATTEMPT_TTL_MS = 24 * 3600 * 1000
SECRET_KEYS = ("username", "password", "client_id", "client_secret", "realm")
# (name, required, meaning): what describe() declares.
CONFIG_KEYS = (
    ("api_type", True, "FM (Fabric Manager); CM is not supported by this example"),
    ("endpoint", True, "host:port/ (HTTPS implied) or a full http(s):// URL of the fabric"),
    ("tenant_id", True, "the fabric tenant"),
    ("timeout_ms", False, "per-request timeout asked of the host"),
)
RENEW_BEFORE_SECS = 30
# Error codes that mean "no free device of that model" (FTI and our simulator).
NO_CAPACITY_CODES = ("insufficient_resources", "e0409")
PROVIDER_ID_PREFIX = "fsas-cdi://"


def log_info(message: str) -> None:
    log.log(log.Level.INFO, message)


def log_warn(message: str) -> None:
    log.log(log.Level.WARN, message)


def fail(error) -> None:
    raise Err(error)


def malformed(what: str):
    return Err(ProviderError_MalformedReply(what))


def fabric_type(device_type: DeviceType) -> str:
    return "gpu" if device_type == DeviceType.GPU else "cxlmemory"


def device_type_of(text) -> Optional[DeviceType]:
    if not isinstance(text, str):
        return None
    t = text.lower()
    return DeviceType.GPU if t == "gpu" else DeviceType.CXLMEMORY if t == "cxlmemory" else None


def _text(v) -> Optional[str]:
    if v is None:
        return None
    return v if isinstance(v, str) else json.dumps(v)


def fabric_error(status: int, body: bytes):
    """The typed error of a non-2xx reply, keeping the vendor's code and message."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    code, message = "", None
    if isinstance(parsed, dict):
        detail = parsed.get("detail")
        if isinstance(detail, dict):
            code = _text(detail.get("code")) or ""
            message = _text(detail.get("message"))
        code = code or _text(parsed.get("code")) or ""
        message = message or _text(parsed.get("message"))
        error = parsed.get("error")
        if isinstance(error, dict):
            code = code or _text(error.get("code")) or ""
            message = message or _text(error.get("message"))
        elif error is not None:
            code = code or _text(error) or ""
        message = message or _text(parsed.get("error_description"))
        if message is None and isinstance(detail, str):
            message = detail
    if message is None:
        message = body[:2048].decode("utf-8", "replace")
    if code and code.lower() in NO_CAPACITY_CODES:
        return Err(ProviderError_NoCapacity(
            f"the fabric has no free device (HTTP {status}, code '{code}'): {message}"))
    return Err(ProviderError_Fabric(FabricError(status=status, code=code, message=message)))


def send(method, url: str, headers, body: bytes, timeout_ms: Optional[int]) -> http.Response:
    try:
        return http.send(http.Request(method=method, url=url, headers=headers, body=body,
                                      timeout_ms=timeout_ms))
    except Err as e:
        err = e.value
        if isinstance(err, http.HttpError_Denied):
            raise Err(ProviderError_Denied(err.value))
        if isinstance(err, http.HttpError_Timeout):
            raise Err(ProviderError_Unavailable(f"{url}: timed out"))
        if isinstance(err, (http.HttpError_Connect, http.HttpError_Tls)):
            raise Err(ProviderError_Unavailable(f"{url}: {err.value}"))
        if isinstance(err, http.HttpError_TooLarge):
            raise malformed(f"{url}: reply larger than {err.value} bytes")
        if isinstance(err, http.HttpError_InvalidRequest):
            raise Err(ProviderError_Config(f"{url}: {err.value}"))
        raise Err(ProviderError_Other(f"{url}: {err.value}"))


def secret(key: str) -> str:
    try:
        return secrets.get(key)
    except Err as e:
        err = e.value
        if isinstance(err, secrets.SecretError_Denied):
            raise Err(ProviderError_Denied(f"secret key {key}: {err.value}"))
        raise Err(ProviderError_Config(f"secret key {key}: {err.value}"))


def jwt_expiry(token: str) -> int:
    parts = token.split(".")
    if len(parts) != 3:
        raise malformed("the access token is not a JWT")
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
        exp = claims["exp"]
    except (ValueError, KeyError, TypeError):
        raise malformed("the access token's payload has no readable 'exp'")
    if not isinstance(exp, (int, float)) or isinstance(exp, bool):
        raise malformed("the access token's 'exp' is not a number")
    return int(exp)


def base_url(endpoint: str) -> str:
    """`host:port/` (HTTPS implied) or a full http(s) URL, always ending in `/`."""
    endpoint = endpoint.strip()
    if "://" not in endpoint:
        endpoint = "https://" + endpoint
    scheme = endpoint.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise Err(ProviderError_Config(f"endpoint {endpoint}: only http and https are supported"))
    return endpoint if endpoint.endswith("/") else endpoint + "/"


class Fabric:
    def __init__(self, base: str, tenant: str, timeout_ms: Optional[int]):
        self.base = base
        self.tenant = tenant
        self.timeout_ms = timeout_ms
        self.token: Optional[str] = None

    @staticmethod
    def from_config() -> "Fabric":
        def required(key: str) -> str:
            value = config.get(key)
            if value is None or not value.strip():
                raise Err(ProviderError_Config(f"config key '{key}' is required"))
            return value.strip()

        api = required("api_type").upper()
        if api == "CM":
            raise Err(ProviderError_Config(
                "api_type CM (Cluster Manager) is not supported by the Python example provider; "
                "it speaks the Fabric Manager API only (api_type: FM)"))
        if api != "FM":
            raise Err(ProviderError_Config(f"api_type '{api}' is unknown; use FM"))
        timeout = config.get("timeout_ms")
        timeout_ms = None
        if timeout is not None:
            try:
                timeout_ms = int(timeout)
            except ValueError:
                raise Err(ProviderError_Config(f"timeout_ms '{timeout}' is not a number"))
        return Fabric(base_url(required("endpoint")), required("tenant_id"), timeout_ms)

    # --- token ---------------------------------------------------------------------

    def access_token(self) -> str:
        if self.token is not None:
            return self.token
        cached = state.get(TOKEN_KEY)
        if cached is not None:
            try:
                c = json.loads(cached)
                if c["base_url"] == self.base and time.time() + RENEW_BEFORE_SECS < c["exp"]:
                    self.token = c["access_token"]
                    return self.token
            except (ValueError, KeyError, TypeError):
                log_warn("ignoring an unreadable cached token")
        return self.fetch_token()

    def fetch_token(self) -> str:
        realm = secret("realm").strip()
        form = urlencode({
            "client_id": secret("client_id"),
            "client_secret": secret("client_secret"),
            "username": secret("username"),
            "password": secret("password"),
            "scope": "openid",
            "response_type": "id_token token",
            "grant_type": "password",
        })
        url = f"{self.base}id_manager/realms/{quote(realm, safe='')}/protocol/openid-connect/token"
        reply = send(http.Method.POST, url,
                     [("content-type", "application/x-www-form-urlencoded"),
                      ("accept", "application/json")],
                     form.encode(), self.timeout_ms)
        if reply.status == 401:
            raise Err(ProviderError_Config(
                "credentials rejected by the identity manager (HTTP 401): "
                + reply.body[:2048].decode("utf-8", "replace")))
        if reply.status != 200:
            raise fabric_error(reply.status, reply.body)
        try:
            token = json.loads(reply.body).get("access_token")
        except (ValueError, AttributeError):
            raise malformed("token reply is not a JSON object")
        if not isinstance(token, str) or not token.strip():
            raise malformed("token reply has no access_token")
        token = token.strip()
        exp = jwt_expiry(token)
        fresh_for = exp - RENEW_BEFORE_SECS - int(time.time())
        if fresh_for > 0:
            record = json.dumps({"access_token": token, "exp": exp, "base_url": self.base})
            if not state.set(TOKEN_KEY, record.encode(), fresh_for * 1000):
                log_warn("the host refused to cache the access token")
        self.token = token
        return token

    # --- requests ------------------------------------------------------------------

    def call(self, method, path: str, body=None) -> http.Response:
        """A fabric request with the bearer token; a cached token answered 401 is
        dropped and fetched again once."""
        data = b"" if body is None else json.dumps(body).encode()
        headers = [("accept", "application/json")]
        if body is not None:
            headers.append(("content-type", "application/json"))
        for attempt in (0, 1):
            token = self.access_token()
            reply = send(method, self.base + path,
                         headers + [("authorization", f"Bearer {token}")], data, self.timeout_ms)
            if reply.status == 401 and attempt == 0:
                state.remove(TOKEN_KEY)
                self.token = None
                continue
            if reply.status in (401, 403):
                raise Err(ProviderError_Config(
                    f"the fabric refused the credentials (HTTP {reply.status})"))
            if not 200 <= reply.status < 300:
                raise fabric_error(reply.status, reply.body)
            return reply
        raise Err(ProviderError_Other("unreachable"))

    def call_json(self, method, path: str, what: str, body=None) -> dict:
        reply = self.call(method, path, body)
        try:
            parsed = json.loads(reply.body)
        except ValueError as e:
            raise malformed(f"{what} is not JSON: {e}")
        if not isinstance(parsed, dict):
            raise malformed(f"{what} is not a JSON object")
        return parsed

    def machine_path(self, machine: str, update: bool = False) -> str:
        suffix = "/update" if update else ""
        return (f"fabric_manager/api/v1/machines/{quote(machine, safe='')}{suffix}"
                f"?tenant_uuid={quote(self.tenant, safe='')}")

    # --- machines ------------------------------------------------------------------

    @staticmethod
    def machine_of(node: str) -> str:
        """The fabric machine of a Node: `spec.providerID` is `fsas-cdi://<machine>`."""
        try:
            raw = lookup.get_node(node)
        except Err as e:
            err = e.value
            if isinstance(err, lookup.LookupError_Denied):
                raise Err(ProviderError_Denied(f"node {node}: {err.value}"))
            if isinstance(err, lookup.LookupError_NotFound):
                raise Err(ProviderError_NotFound(f"node {node}: {err.value}"))
            raise Err(ProviderError_Other(f"node {node}: {err.value}"))
        machine = machine_in_node(raw)
        if machine is None:
            raise Err(ProviderError_NotFound(
                f"node {node} has no {PROVIDER_ID_PREFIX} providerID: it is not a fabric machine"))
        return machine

    def read_machine(self, machine: str) -> dict:
        reply = self.call_json(http.Method.GET, self.machine_path(machine), "machine reply")
        data = reply.get("data")
        if not isinstance(data, dict):
            raise malformed("machine reply has no 'data'")
        machines = [m for m in (data.get("machines") or []) if isinstance(m, dict)]
        if not machines:
            raise Err(ProviderError_NotFound(f"the fabric reports no machine {machine}"))
        for m in machines:
            if m.get("mach_uuid") == machine:
                return m
        return machines[0]

    def machine_of_resource(self, r: types.ComposableResource) -> str:
        """The machine recorded at attach when the host passes it (no Node needed, so
        a detach works after the Node is gone), else the target Node's."""
        recorded = present(r.machine_id)
        return recorded if recorded is not None else self.machine_of(r.target_node)

    # --- operations ----------------------------------------------------------------

    def attach_once(self, req: types.AddRequest, machine: str) -> Tuple[str, str]:
        """Attach for the request, without a second device on a retry.

        The Fabric Manager picks the device, so a retry after a lost reply cannot name
        the one the first try got. Before attaching, the machine is read: the device
        this attempt recorded, if still there, is the answer; so is a device of the
        type and model on the machine that no ComposableResource holds (the claims):
        the device of an attach whose reply was lost."""
        r = req.resource
        m = self.read_machine(machine)
        on_machine = resources(m)
        key = ATTEMPT_PREFIX + req.attempt_key
        recorded = state.get(key)
        if recorded is not None:
            try:
                rec = json.loads(recorded)
                for res in on_machine:
                    if rec["machine"] == machine and present(res.get("res_uuid")) == rec["uuid"]:
                        return rec["serial"], rec["uuid"]
            except (ValueError, KeyError, TypeError):
                log_warn("ignoring an unreadable attempt record")
        for res in on_machine:
            serial, uuid = present(res.get("res_serial_num")), present(res.get("res_uuid"))
            if serial is None or uuid is None or not matches(res, r):
                continue
            if claimed_by_another(req, serial, uuid):
                continue
            log_info(f"device {serial} ({uuid}) is on machine {machine} and held by no resource: "
                     f"taken for {r.name}")
            return serial, uuid
        serial, uuid = self.attach(r, machine)
        record = json.dumps({"machine": machine, "serial": serial, "uuid": uuid})
        state.set(key, record.encode(), ATTEMPT_TTL_MS)
        return serial, uuid

    def attach(self, r: types.ComposableResource, machine: str) -> Tuple[str, str]:
        kind = fabric_type(r.device_type)
        body = {"tenants": {"tenant_uuid": self.tenant, "machines": [{
            "mach_uuid": machine,
            "resources": [{"res_specs": [{
                "res_type": kind,
                "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": r.model}]},
                "res_num": 1,
            }]}],
        }]}}
        reply = self.call_json(http.Method.PATCH, self.machine_path(machine, update=True),
                               "attach reply", body)
        try:
            res = reply["data"]["machines"][0]["resources"][0]
        except (KeyError, IndexError, TypeError):
            raise malformed("attach reply lists no resource")
        if not isinstance(res, dict) or not matches(res, r):
            raise malformed(f"attach reply's first resource is not the requested {kind} '{r.model}'")
        serial, uuid = present(res.get("res_serial_num")), present(res.get("res_uuid"))
        if serial is None:
            raise malformed("attached resource has no res_serial_num")
        if uuid is None:
            raise malformed("attached resource has no res_uuid")
        status = op_status(res.get("res_op_status"), serial)
        if status == 1:
            log_warn(f"attached device {serial} ({uuid}) reports a warning")
        elif status == 2:
            raise Err(ProviderError_Critical(
                f"attached device {serial} ({uuid}) reports a critical state"))
        return serial, uuid

    def detach(self, r: types.ComposableResource, machine: str) -> None:
        m = self.read_machine(machine)
        for res in resources(m):
            same = (present(res.get("res_uuid")) == r.fabric_device_id if r.fabric_device_id
                    else present(res.get("res_serial_num")) == r.device_id)
            if same:
                break
        else:
            log_info(f"device {r.device_id or r.fabric_device_id} of {r.name} is no longer on "
                     f"machine {machine}; already detached")
            return
        uuid = present(res.get("res_uuid"))
        if uuid is None:
            raise malformed("machine lists the device without res_uuid")
        kind = present(res.get("res_type")) or fabric_type(r.device_type)
        body = {"tenants": {"tenant_uuid": self.tenant, "machines": [{
            "mach_uuid": machine,
            "resources": [{"res_specs": [{"res_type": kind, "res_uuid": uuid, "res_num": 1}]}],
        }]}}
        self.call(http.Method.DELETE, self.machine_path(machine, update=True), body)

    def check(self, r: types.ComposableResource, machine: str) -> None:
        m = self.read_machine(machine)
        for res in resources(m):
            if matches(res, r) and present(res.get("res_serial_num")) == r.device_id:
                status = op_status(res.get("res_op_status"), r.device_id)
                if status == 1:
                    raise Err(ProviderError_Warning(f"device {r.device_id} reports a warning"))
                if status == 2:
                    raise Err(ProviderError_Critical(f"device {r.device_id} reports a critical state"))
                return
        raise Err(ProviderError_NotFound(
            f"device {r.device_id} ({fabric_type(r.device_type)} '{r.model}') is not attached "
            f"to machine {machine}"))

    def all_devices(self) -> List[DeviceInfo]:
        try:
            nodes = lookup.list_nodes()
        except Err as e:
            err = e.value
            if isinstance(err, lookup.LookupError_Denied):
                raise Err(ProviderError_Denied(f"listing nodes: {err.value}"))
            raise Err(ProviderError_Other(f"listing nodes: {err.value}"))
        devices: List[DeviceInfo] = []
        for raw in nodes:
            try:
                node = json.loads(raw)
                name = node["metadata"]["name"]
            except (ValueError, KeyError, TypeError):
                log_warn("device listing skips a node the host returned unreadable")
                continue
            machine = machine_in_node(raw)
            if machine is None:
                continue
            try:
                m = self.read_machine(machine)
            except Err as e:
                err = e.value
                # One unknown machine must not hide every other node's devices.
                if isinstance(err, ProviderError_NotFound) or (
                        isinstance(err, ProviderError_Fabric) and err.value.status == 404):
                    log_warn(f"device listing skips node {name}: machine {machine} is unknown")
                    continue
                raise
            for res in resources(m):
                kind = device_type_of(res.get("res_type"))
                serial, uuid = present(res.get("res_serial_num")), present(res.get("res_uuid"))
                if kind is None:
                    continue
                if serial is None or uuid is None:
                    log_warn(f"machine {machine} lists a device without serial or res_uuid; skipped")
                    continue
                devices.append(DeviceInfo(node=name, machine_id=machine, device_type=kind,
                                          model=model_of(res) or "", device_id=serial,
                                          fabric_device_id=uuid))
        return devices


def claimed_by_another(req: types.AddRequest, serial: str, uuid: str) -> bool:
    """Whether a ComposableResource other than the request's holds the device."""
    for c in req.claims:
        if c.resource == req.resource.name:
            continue
        if c.device_id in (serial, uuid) or c.fabric_device_id in (serial, uuid):
            return True
    return False


def machine_in_node(raw: str) -> Optional[str]:
    try:
        provider_id = json.loads(raw).get("spec", {}).get("providerID")
    except (ValueError, AttributeError):
        return None
    if isinstance(provider_id, str) and provider_id.startswith(PROVIDER_ID_PREFIX):
        return present(provider_id[len(PROVIDER_ID_PREFIX):])
    return None


def present(v) -> Optional[str]:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = str(v)
    if isinstance(v, str) and v.strip():
        return v.strip()
    return None


def resources(machine: dict) -> list:
    return [r for r in (machine.get("resources") or []) if isinstance(r, dict)]


def model_of(res: dict) -> Optional[str]:
    spec = res.get("res_spec")
    conditions = spec.get("condition") if isinstance(spec, dict) else None
    for c in conditions or []:
        if isinstance(c, dict) and c.get("column") == "model" and c.get("operator") == "eq":
            return _text(c.get("value"))
    return None


def matches(res: dict, r: types.ComposableResource) -> bool:
    return device_type_of(res.get("res_type")) == r.device_type and model_of(res) == r.model


def op_status(value, device: str) -> int:
    """0 OK, 1 warning, 2 critical (the first character); anything else is unreadable."""
    text = present(value)
    if text is None or text[0] not in "012":
        raise malformed(f"device {device} reports an unreadable operational status {value!r}")
    return int(text[0])
