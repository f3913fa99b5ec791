# /etc/profile.d/gpuhub-path.sh, written by the gpuhub/base build from images/base/gpuhub-path.sh
# with @IMAGE_PATH@ replaced by the image's PATH (its ENV: /opt/venv/bin first, and on a CUDA
# base NVIDIA's own directories).
#
# Debian's and Ubuntu's /etc/profile set PATH afresh for every login shell, and JupyterLab's
# terminal is one (terminado runs `bash -l`): without this file a member's terminal would lose
# the venv's python, pip and jupyter. Puts the image's PATH back in front and keeps, behind it,
# what /etc/profile set (/usr/bin among them, where the NVIDIA container runtime puts
# nvidia-smi), each directory once. POSIX sh: dash reads this file for `sh -l` too.
gpuhub_path='@IMAGE_PATH@'
gpuhub_rest=$PATH
while [ -n "$gpuhub_rest" ]; do
  gpuhub_dir=${gpuhub_rest%%:*}
  case $gpuhub_rest in
    *:*) gpuhub_rest=${gpuhub_rest#*:} ;;
    *) gpuhub_rest= ;;
  esac
  case ":$gpuhub_path:" in
    *":$gpuhub_dir:"*) ;;
    *) gpuhub_path=$gpuhub_path:$gpuhub_dir ;;
  esac
done
PATH=$gpuhub_path
export PATH
unset gpuhub_path gpuhub_rest gpuhub_dir
