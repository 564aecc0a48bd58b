set -u
NCU=/usr/local/cuda/bin/ncu
mkdir -p /tmp/n
for spec in "1 ROWMASK+W1D+NOSYNC" "2 ROWMASK+W1D+NOSYNC" "1 ROWMASK+W1D" "2 ROWMASK+W1D" "1 copy"; do
  set -- $spec
  tag=${2}_$1
  timeout 120 $NCU --clock-control none -k regex:'^walk$' --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section SourceCounters --section WarpStateStats --section MemoryWorkloadAnalysis \
    --import-source no -o /tmp/n/$tag python3 diag/walk_variants.py qwen36_35b_a3b $1 profile $2 > /tmp/n/$tag.log 2>&1
  $NCU -i /tmp/n/$tag.ncu-rep --page source --csv --print-source sass > /tmp/n/$tag.csv 2>&1
  $NCU -i /tmp/n/$tag.ncu-rep --page details > /tmp/n/$tag.txt 2>&1
  grep -E "Duration|L2 Hit|Mem Busy|Max Bandwidth" /tmp/n/$tag.txt | head -5
done
tar czf $OUT/ncu.tgz -C /tmp/n $(cd /tmp/n && ls *.csv *.txt *.log)
