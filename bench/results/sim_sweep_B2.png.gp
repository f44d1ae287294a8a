set terminal pngcairo size 1000,600 noenhanced
set output 'bench/results/sim_sweep_B2.png'
set xlabel 'depth'
set ylabel 'predicted update (s)'
set logscale x 2
set key below
set title 'ferry sim --sweep: examples/sim/B2.toml'
$line0 << EOD
1 0.530824
2 0.439114
4 0.439114
8 0.439097
EOD
$line1 << EOD
1 0.282055
2 0.241107
4 0.241574
8 0.242490
EOD
$line2 << EOD
1 0.524305
2 0.435129
4 0.435096
8 0.435028
EOD
$line3 << EOD
1 0.274083
2 0.243861
4 0.245613
8 0.248950
EOD
plot $line0 using 1:2 with linespoints title 'chunk MiB,stripes 16,1', $line1 using 1:2 with linespoints title 'chunk MiB,stripes 16,2', $line2 using 1:2 with linespoints title 'chunk MiB,stripes 64,1', $line3 using 1:2 with linespoints title 'chunk MiB,stripes 64,2'
