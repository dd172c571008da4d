# Jupyter Server's configuration for a sandgate bundle, written by `sandgate jupyter compose`.
# `sandgate jupyter launch` starts the server with this file only (JUPYTER_NO_CONFIG=1 and
# --config): no user, environment or system configuration and no server extension is read.
# Paths come from this file's place, so the bundle can move. See docs/jupyter.md.
#
# The kernels' sandboxes are not made here: each kernelspec's argv runs its kernel through
# `sandgate run` with its profile's policy. This file decides three things the sandboxes
# rely on: only the bundle's kernelspecs can start; each kernel's ZeroMQ sockets (the ipc
# transport) and nothing else sit in a directory of its own; the contents API does not
# follow a symlink out of the workspace that a kernel may have planted.
import os
import shutil

from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_server.files.handlers import FilesHandler
from jupyter_server.services.contents.filecheckpoints import AsyncFileCheckpoints
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado.web import HTTPError
from traitlets import default

BUNDLE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
WORKSPACE = os.path.join(BUNDLE, "workspace")
KERNELS = frozenset(@KERNELS@)
DEFAULT_KERNEL = @DEFAULT_KERNEL@


class BundleKernelSpecs(KernelSpecManager):
    """The bundle's kernelspecs, and no other. `allowed_kernelspecs` alone only hides the
    others from the list: `get_kernel_spec` would still find every installed kernelspec, and
    the native `python3` (ipykernel's, outside any sandbox), for a client that names it."""

    def _kernel_dirs_default(self):
        return [os.path.join(BUNDLE, "kernels")]

    def find_kernel_specs(self):
        return {n: d for n, d in super().find_kernel_specs().items() if n in KERNELS}

    def get_kernel_spec(self, kernel_name):
        if kernel_name not in KERNELS:
            raise NoSuchKernel(kernel_name)
        return super().get_kernel_spec(kernel_name)


class SandboxedKernels(AsyncMappingKernelManager):
    """Each kernel's sockets in CONNECTION_FILE.d (0700), which its sandbox binds
    read-write; its policy binds the connection file read-only. No other kernel's sandbox
    sees either, so no other kernel can read this one's key or reach its sockets."""

    def pre_start_kernel(self, kernel_name, kwargs):
        # Refuse an unknown kernel (404, not a server error) before anything is made for it.
        name = kernel_name or self.default_kernel_name
        try:
            self.kernel_spec_manager.get_kernel_spec(name)
        except NoSuchKernel:
            raise HTTPError(404, "no kernelspec %r in this bundle (it has %s)" % (name, ", ".join(sorted(KERNELS)))) from None
        km, kernel_name, kernel_id = super().pre_start_kernel(kernel_name, kwargs)
        sockets = km.connection_file + ".d"
        os.mkdir(sockets, 0o700)
        km.transport = "ipc"
        km.ip = os.path.join(sockets, "ipc")
        return km, kernel_name, kernel_id

    def remove_kernel(self, kernel_id):
        km = super().remove_kernel(kernel_id)
        if km is not None:
            shutil.rmtree(km.connection_file + ".d", ignore_errors=True)
        return km


def inside_workspace(os_path, shown):
    """os_path, if it stays in the workspace once every symlink is resolved; else 404."""
    root = os.path.realpath(WORKSPACE)
    real = os.path.realpath(os_path)
    if real != root and not real.startswith(root + os.sep):
        raise HTTPError(404, "%s is outside the workspace" % shown)
    return os_path


class WorkspaceCheckpoints(AsyncFileCheckpoints):
    """Checkpoints (.ipynb_checkpoints/) under the same rule: a kernel could make that
    directory a symlink, and every checkpoint would be written where it points."""

    def checkpoint_path(self, checkpoint_id, path):
        parent = ("/" + path.strip("/")).rsplit("/", 1)[0].strip("/")
        inside_workspace(os.path.join(self._get_os_path(path=parent), self.checkpoint_dir), path)
        return inside_workspace(super().checkpoint_path(checkpoint_id, path), path)


class WorkspaceContents(AsyncLargeFileManager):
    """Files under the workspace only, symlinks resolved: kernels write the workspace, and
    the server (outside any sandbox) would otherwise read or write through a link a kernel
    planted, to ~/.ssh or ~/.bashrc. /files/ and checkpoints go through this check too."""

    @default("files_handler_class")
    def _files_through_this_check(self):
        return FilesHandler

    @default("checkpoints_class")
    def _checkpoints_through_this_check(self):
        return WorkspaceCheckpoints

    def _get_os_path(self, path):
        return inside_workspace(super()._get_os_path(path), path)


c = get_config()  # noqa: F821 (traitlets provides it)
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.port_retries = 0
c.ServerApp.open_browser = False
c.ServerApp.allow_remote_access = False
c.ServerApp.root_dir = WORKSPACE
# A terminal would be a shell outside every sandbox.
c.ServerApp.terminals_enabled = False
# Jupyter refuses root because kernels run as the server's user; here every kernel runs in
# a sandbox with every capability dropped, and there are no terminals.
c.ServerApp.allow_root = True
c.ServerApp.kernel_spec_manager_class = BundleKernelSpecs
c.ServerApp.kernel_manager_class = SandboxedKernels
c.ServerApp.contents_manager_class = WorkspaceContents
c.ContentsManager.allow_hidden = False
c.KernelSpecManager.ensure_native_kernel = False
c.KernelSpecManager.allowed_kernelspecs = set(KERNELS)
c.MappingKernelManager.default_kernel_name = DEFAULT_KERNEL
c.ServerKernelManager.transport = "ipc"
