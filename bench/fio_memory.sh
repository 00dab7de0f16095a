# Sourced by the fio comparisons (randread_vs_fio.sh, read_vs_fio.sh): gives fio's I/O buffers
# huge pages, as ringtier's have, while the pairs run.
#
# ringtier's read buffers of 2 MiB and more are on transparent huge pages (it asks with
# madvise); fio's (iomem=malloc) get them only when the kernel's mode is "always". A 128 KiB
# O_DIRECT read into 4 KiB pages is 32 segments for the driver and the host instead of one: on
# the project's virtio disk that made fio 1.2 to 1.3x slower with nothing else different
# (bench/results/tune-fio-thp.md; shared/MEASURING.md: allocate both sides' buffers the same
# way). Where the mode is "madvise" it is set to "always" and put back by fio_memory_restore
# (call it from the script's EXIT trap). FIO_SMALL_PAGES=1 leaves the mode alone. FIO_MEMORY
# says what fio's buffers were on, for the report.
THP_ENABLED=/sys/kernel/mm/transparent_hugepage/enabled
THP_WAS=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$THP_ENABLED" 2>/dev/null || true)
THP_CHANGED=
case "$THP_WAS" in
  always) FIO_MEMORY="fio's buffers on huge pages as ringtier's (transparent huge pages: always)" ;;
  never) FIO_MEMORY="neither side's buffers on huge pages (transparent huge pages: never)" ;;
  madvise)
    if [ -n "${FIO_SMALL_PAGES:-}" ]; then
      FIO_MEMORY="fio's buffers on 4 KiB pages, ringtier's on huge pages (FIO_SMALL_PAGES set)"
    elif echo always 2>/dev/null > "$THP_ENABLED"; then
      THP_CHANGED=1
      FIO_MEMORY="fio's buffers on huge pages as ringtier's (transparent huge pages always while the pairs ran, madvise again after)"
    else
      FIO_MEMORY="fio's buffers on 4 KiB pages, ringtier's on huge pages (could not write $THP_ENABLED: run as root to compare at equal memory)"
    fi ;;
  *) FIO_MEMORY="transparent huge pages unknown: fio's buffers may be on 4 KiB pages" ;;
esac
export FIO_MEMORY
echo "memory: $FIO_MEMORY"

fio_memory_restore() {
  if [ -n "$THP_CHANGED" ]; then
    echo madvise 2>/dev/null > "$THP_ENABLED" || echo "could not put $THP_ENABLED back to madvise" >&2
    THP_CHANGED=
  fi
}
