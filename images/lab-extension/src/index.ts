/**
 * GPU Cluster Hub in JupyterLab (docs/howto/gpu-in-jupyterlab.md).
 *
 * The status bar shows each GPU this server and its GPU kernels hold (utilisation and
 * memory, "simulated" on the demo's simulated GPUs), and each GPU kernel of this server
 * that waits in line with its place in words; a GPU kernel the hub ended (idle time-out,
 * an admin, its container) is told as a notification with the hub's reason.  Where
 * JupyterLab shows a kernel's details (the tooltips of the launcher's cards and of the
 * kernel picker's choices), a GPU kernel says how many GPUs are free now.
 *
 * The status comes from the server extension `gpuhub_lab` (`GET <base>/gpuhub-lab/status`),
 * which asks the hub with the server's own token: the browser holds no hub credentials.
 * The GPU kernels' figures are their kernelspecs' (`metadata.gpuhub`, which the server's
 * kernelspec manager reads from the hub), asked again while a launcher or a kernel picker
 * is open.
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

/** A GPU kernelspec's figures (its `metadata.gpuhub`, from the hub's `kernels/specs`). */
export interface ISpecGPUs {
  gpus: number;
  credits_per_hour: number;
  free_now: number;
  total: number;
  simulated: boolean;
  why_not: string | null;
}

/** A GPU kernelspec's name starts so (`gpuhub-<profile>`). */
const SPEC_PREFIX = 'gpuhub-';
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

/**
 * A GPU kernel's details, as the tooltip of its launcher card and kernel picker choice:
 * "Python 3 (PyTorch, 1 GPU, 1.00 credits/h)\n1 of 2 GPUs free now", and when none is
 * free for it, that it waits in line; the hub's sentence when it cannot start for her.
 */
export function specDetails(displayName: string, gpus: ISpecGPUs): string {
  const total = `${gpus.total} GPU${gpus.total === 1 ? '' : 's'}`;
  const lines = [
    displayName,
    `${gpus.free_now} of ${total} free now` + (gpus.simulated ? ' (simulated)' : '')
  ];
  if (gpus.why_not) {
    lines.push(gpus.why_not);
  } else if (gpus.free_now < gpus.gpus) {
    lines.push('It waits in line for its GPU and starts by itself.');
  }
  return lines.join('\n');
}

/** A kernelspec, as far as read here. */
interface ISpecModel {
  display_name: string;
  metadata?: { gpuhub?: ISpecGPUs };
}

/**
 * Kernelspecs by name: the server's answer (`GET <base>/api/kernelspecs`: each under
 * `spec`) or JupyterLab's own model of it (each as it is).
 */
interface IKernelSpecs {
  kernelspecs: { [name: string]: (ISpecModel & { spec?: ISpecModel }) | null | undefined };
}

/**
 * The GPU kernels' details where JupyterLab shows a kernel's: the tooltips of the
 * launcher's cards (matched by their label, the kernelspec's display name) and of the
 * kernel picker's choices (matched by their value, the kernelspec's name).
 */
export class SpecDetails {
  constructor(private settings: ServerConnection.ISettings) {}

  /** Keep the GPU kernelspecs of ``specs`` (a kernelspecs answer). */
  keep(specs: IKernelSpecs): void {
    this.byName.clear();
    this.byDisplayName.clear();
    for (const [name, model] of Object.entries(specs.kernelspecs || {})) {
      const spec = model?.spec ?? model;
      const gpus = spec?.metadata?.gpuhub;
      if (name.startsWith(SPEC_PREFIX) && spec && gpus) {
        const details = specDetails(spec.display_name, gpus);
        this.byName.set(name, details);
        this.byDisplayName.set(spec.display_name, details);
      }
    }
  }

  /** Whether a launcher or a kernel picker is open (then the figures are read again). */
  shown(): boolean {
    return document.querySelector('.jp-LauncherCard, .jp-Dialog select') !== null;
  }

  /** Read the kernelspecs again (the server asks the hub at most every few seconds). */
  async refresh(): Promise<void> {
    const url = URLExt.join(this.settings.baseUrl, 'api', 'kernelspecs');
    const response = await ServerConnection.makeRequest(url, {}, this.settings);
    if (response.ok) {
      this.keep((await response.json()) as IKernelSpecs);
    }
  }

  /** Write the details into the tooltips on the page now. */
  decorate(): void {
    document.querySelectorAll<HTMLElement>('.jp-LauncherCard').forEach(card => {
      const label = card.querySelector('.jp-LauncherCard-label');
      const details = this.byDisplayName.get(label?.textContent || '');
      if (details !== undefined && card.title !== details) {
        card.title = details;
        (label as HTMLElement).title = details;
      }
    });
    document
      .querySelectorAll<HTMLOptionElement>('.jp-Dialog select option')
      .forEach(option => {
        let name = '';
        try {
          name = (JSON.parse(option.value) || {}).name || '';
        } catch {
          return;
        }
        const details = this.byName.get(name);
        if (details !== undefined && option.title !== details) {
          option.title = details;
        }
      });
  }

  private byName = new Map<string, string>();
  private byDisplayName = new Map<string, string>();
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
    const details = new SpecDetails(settings);
    const kernelspecs = app.serviceManager.kernelspecs;
    const keepSpecs = (): void => {
      if (kernelspecs.specs) {
        details.keep(kernelspecs.specs as unknown as IKernelSpecs);
        details.decorate();
      }
    };
    kernelspecs.specsChanged.connect(keepSpecs);
    void kernelspecs.ready.then(keepSpecs);
    // a launcher or a kernel picker drawn: its GPU kernels' tooltips at once
    new MutationObserver(() => details.decorate()).observe(document.body, {
      childList: true,
      subtree: true
    });
    const pollSpecs = async (): Promise<void> => {
      try {
        if (details.shown()) {
          await details.refresh();
          details.decorate();
        }
      } catch (reason) {
        console.warn('gpuhub-lab: the GPU kernels could not be read', reason);
      }
      window.setTimeout(pollSpecs, POLL_MS);
    };
    void pollSpecs();
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
