/**
 * GPU Cluster Hub in JupyterLab (docs/howto/gpu-in-jupyterlab.md).
 *
 * The status bar shows each GPU this server and its GPU kernels hold (utilisation and
 * memory, "simulated" on the demo's simulated GPUs), and each GPU kernel of this server
 * that waits in line with its place in words; a GPU kernel the hub ended (idle time-out,
 * an admin, its container) is told as a notification with the hub's reason.
 *
 * Everything comes from the server extension `gpuhub_lab` (`GET <base>/gpuhub-lab/status`),
 * which asks the hub with the server's own token: the browser holds no hub credentials.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

/** A GPU held by this server or one of its GPU kernels (the hub's `gpus/mine` row). */
export interface IGPU {
  uuid: string;
  name: string;
  held_by: string;
  utilization_pct: number | null;
  memory_used_mib: number | null;
  memory_total_mib: number | null;
  simulated: boolean;
}

/** A GPU kernel of this server (the hub's `kernels/<id>` model, as far as read here). */
export interface IKernel {
  id: string;
  notebook: string;
  state: 'waiting' | 'starting' | 'running' | 'ended';
  place: { position: number; estimate_s: number | null; message: string } | null;
  ended: { reason: string; message: string } | null;
}

/** What the server extension answers. */
export interface IStatus {
  gpus: IGPU[];
  kernels: IKernel[];
  error: string;
}

/** A GPU kernel's server name starts so (the hub's `kernel-<id>`). */
const KERNEL_PREFIX = 'kernel-';
/** Reasons of kernels the member ended herself: no notification. */
const HER_OWN = new Set(['shutdown', 'left']);
/** Milliseconds between reads; the hub's NVML read is itself a couple of seconds old. */
const POLL_MS = 5000;

function gib(mib: number): string {
  return (mib / 1024).toFixed(1);
}

function fileName(path: string): string {
  return path.split('/').pop() || path;
}

/** A GPU as the status bar says it: "GPU 37% · 2.0 / 40.0 GiB (simulated)". */
export function gpuText(gpu: IGPU): string {
  const who = gpu.held_by.startsWith(KERNEL_PREFIX) ? 'GPU kernel' : 'GPU';
  const parts: string[] = [];
  if (gpu.utilization_pct !== null) {
    parts.push(`${gpu.utilization_pct}%`);
  }
  if (gpu.memory_used_mib !== null && gpu.memory_total_mib !== null) {
    parts.push(`${gib(gpu.memory_used_mib)} / ${gib(gpu.memory_total_mib)} GiB`);
  } else if (gpu.memory_used_mib !== null) {
    parts.push(`${gib(gpu.memory_used_mib)} GiB`);
  }
  const figures = parts.length ? parts.join(' · ') : gpu.name;
  return `${who} ${figures}` + (gpu.simulated ? ' (simulated)' : '');
}

/** A GPU's longer description, for the item's tooltip. */
export function gpuTitle(gpu: IGPU): string {
  const holder = gpu.held_by.startsWith(KERNEL_PREFIX)
    ? `your GPU kernel ${gpu.held_by}`
    : 'this server';
  const none =
    gpu.utilization_pct === null && gpu.memory_used_mib === null
      ? ' The hub reads no utilisation or memory for this GPU.'
      : '';
  const simulated = gpu.simulated
    ? ' Simulated: the demo has no real GPU; these are the stand-in\'s figures.'
    : '';
  return `${gpu.name} (${gpu.uuid}), held by ${holder}.${none}${simulated}`;
}

/** A GPU kernel still on its way, or null: "GPU kernel for a.ipynb: Waiting for a GPU: ...". */
export function kernelText(kernel: IKernel): string | null {
  const name = `GPU kernel for ${fileName(kernel.notebook)}`;
  if (kernel.state === 'waiting' && kernel.place) {
    return `${name}: ${kernel.place.message}`;
  }
  if (kernel.state === 'waiting' || kernel.state === 'starting') {
    return `${name}: starting`;
  }
  return null;
}

/** The kernels to tell about: ended by the hub (not by her), not told yet. */
export function newlyEnded(kernels: IKernel[], told: Set<string>): IKernel[] {
  return kernels.filter(
    k =>
      k.state === 'ended' &&
      k.ended !== null &&
      !HER_OWN.has(k.ended.reason) &&
      !told.has(k.id)
  );
}

/** The status bar item: one span per GPU and per GPU kernel on its way. */
export class GPUStatus extends Widget {
  constructor() {
    super();
    this.id = 'gpuhub-gpu-status';
    this.addClass('gpuhub-GPUStatus');
    this.hide();
  }

  show_(status: IStatus): void {
    const node = this.node;
    node.textContent = '';
    const items: HTMLElement[] = [];
    for (const gpu of status.gpus) {
      const span = document.createElement('span');
      span.className = 'gpuhub-GPUStatus-item';
      span.dataset.uuid = gpu.uuid;
      span.textContent = gpuText(gpu);
      span.title = gpuTitle(gpu);
      items.push(span);
    }
    for (const kernel of status.kernels) {
      const text = kernelText(kernel);
      if (text !== null) {
        const span = document.createElement('span');
        span.className = 'gpuhub-GPUStatus-item gpuhub-GPUStatus-waiting';
        span.dataset.kernel = kernel.id;
        span.textContent = text;
        span.title = kernel.notebook;
        items.push(span);
      }
    }
    items.forEach((item, i) => {
      if (i) {
        node.appendChild(document.createTextNode(' | '));
      }
      node.appendChild(item);
    });
    this.node.title = status.error;
    this.setHidden(items.length === 0);
  }
}

/** The ids of ended kernels already told, kept per server in the browser. */
class Told {
  constructor(private key: string) {
    try {
      this.ids = new Set(JSON.parse(window.localStorage.getItem(key) || '[]'));
    } catch {
      this.ids = new Set();
    }
  }

  add(id: string): void {
    this.ids.add(id);
    try {
      window.localStorage.setItem(this.key, JSON.stringify([...this.ids].slice(-200)));
    } catch {
      // a browser without storage tells again after a reload
    }
  }

  ids: Set<string>;
}

async function readStatus(settings: ServerConnection.ISettings): Promise<IStatus> {
  const url = URLExt.join(settings.baseUrl, 'gpuhub-lab', 'status');
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new Error(`${response.status} ${response.statusText}`);
  }
  return (await response.json()) as IStatus;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuhub-lab:status',
  description: 'Your GPUs and GPU kernels in the status bar; why a GPU kernel ended.',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    const settings = app.serviceManager.serverSettings;
    const widget = new GPUStatus();
    if (statusBar) {
      statusBar.registerStatusItem('gpuhub-lab:status', {
        item: widget,
        align: 'left',
        rank: 100
      });
    }
    const told = new Told(`gpuhub-lab:told:${settings.baseUrl}`);
    const poll = async (): Promise<void> => {
      try {
        const status = await readStatus(settings);
        widget.show_(status);
        for (const kernel of newlyEnded(status.kernels, told.ids)) {
          Notification.warning(
            `Your GPU kernel for ${fileName(kernel.notebook)} ended: ${kernel.ended!.message}`,
            { autoClose: false }
          );
          told.add(kernel.id);
        }
      } catch (reason) {
        console.warn('gpuhub-lab: the GPU status could not be read', reason);
      }
      window.setTimeout(poll, POLL_MS);
    };
    void poll();
  }
};

export default plugin;
